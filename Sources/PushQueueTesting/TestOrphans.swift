import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What an earlier test process left running when it died without cleaning up (killed by a signal, a tool's
/// time limit, ^C): its workers (some SIGSTOPped by freeze tests), Python peers and Postgres clusters. They
/// hold ports, CPU and sessions, and the next run fails in dozens of places. Every child of a test process
/// inherits `PUSH_TEST_OWNER=<pid>:<start time>` from its environment; a new test process first kills every
/// process whose owner is gone (the same pid with the same start time no longer exists), then marks itself.
enum TestOrphans {
    static let variable = "PUSH_TEST_OWNER"

    /// `<pid>:<start time in clock ticks since boot>`, or `nil` when the process does not exist.
    static func identity(of pid: Int32) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // After the command's closing parenthesis: state is field 3, the start time field 22.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return "\(pid):\(fields[19])"
    }

    /// Kills orphans of dead test processes (and removes their clusters' directories), then marks this process
    /// so that its own children can be found the same way. Returns how many processes it killed.
    @discardableResult
    static func sweepAndMark() -> Int {
        let me = getpid()
        guard let mine = Self.identity(of: me) else { return 0 }
        var killed = 0
        var deadOwners = Set<Int32>()
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for entry in entries {
            guard let pid = Int32(entry), pid != me,
                let environ = FileManager.default.contents(atPath: "/proc/\(pid)/environ")
            else { continue }
            let prefix = Array("\(Self.variable)=".utf8)
            for variable in environ.split(separator: 0) where variable.starts(with: prefix) {
                let owner = String(decoding: variable.dropFirst(prefix.count), as: UTF8.self)
                guard owner != mine, let ownerPID = owner.split(separator: ":").first.flatMap({ Int32($0) }),
                    Self.identity(of: ownerPID) != owner
                else { continue }
                // A stopped process gets SIGKILL too; SIGCONT first so nothing waits on it meanwhile.
                kill(pid, SIGCONT)
                kill(pid, SIGKILL)
                killed += 1
                deadOwners.insert(ownerPID)
            }
        }
        // The throwaway clusters of dead test processes (TestPostgres names them after the process id).
        let temporary = FileManager.default.temporaryDirectory.path
        for name in (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? [] {
            let parts = name.split(separator: "-")
            guard name.hasPrefix("pushworker-test-"), parts.count >= 3, let pid = Int32(parts[2]),
                deadOwners.contains(pid), Self.identity(of: pid) == nil
            else { continue }
            try? FileManager.default.removeItem(atPath: temporary + "/" + name)
        }
        if killed > 0 {
            FileHandle.standardError.write(
                Data("killed \(killed) processes an earlier test run left behind (its process died)\n".utf8)
            )
        }
        setenv(Self.variable, mine, 1)
        return killed
    }
}
