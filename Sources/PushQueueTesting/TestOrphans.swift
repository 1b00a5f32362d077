import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What an earlier test process left running when it died without cleaning up (killed by a signal, a tool's
/// time limit, ^C): its workers (some SIGSTOPped by freeze tests), Python peers and Postgres clusters. They
/// hold ports, CPU and sessions, and the next run fails in dozens of places. Every child of a test process
/// inherits `PUSH_TEST_OWNER=<pid namespace>:<pid>:<start time>` from its environment; a new test process marks
/// itself, then kills every process of its own pid namespace whose owner is gone (that pid with that start time
/// no longer exists). A process of another namespace (a container's) is never touched: its pids mean other
/// processes there.
enum TestOrphans {
    static let variable = "PUSH_TEST_OWNER"

    /// The pid namespace `pid` lives in (`pid:[4026531836]`), or `nil`.
    static func namespace(of pid: Int32) -> String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/pid")
    }

    /// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or `nil`.
    static func startTime(of pid: Int32) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // After the command's closing parenthesis (a command may hold spaces and parentheses): field 3 on.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return String(fields[19])
    }

    /// Marks this process (before it starts any child), then sweeps on a thread of its own: reading another
    /// process's environment can block while that process is stuck in the kernel, and the test run must not.
    static func markAndSweep() {
        let me = getpid()
        guard let namespace = Self.namespace(of: me), let start = Self.startTime(of: me) else { return }
        setenv(Self.variable, "\(namespace):\(me):\(start)", 1)
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            Self.sweep(namespace: namespace, me: me)
            done.signal()
        }
        thread.name = "push-test-orphans"
        thread.start()
        _ = done.wait(timeout: .now() + 10)
    }

    /// Kills orphans of dead test processes in `namespace`, and removes their clusters' directories.
    static func sweep(namespace: String, me: Int32) {
        var killed = 0
        var deadOwners = Set<Int32>()
        let prefix = Array("\(Self.variable)=\(namespace):".utf8)
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry), pid != me, Self.namespace(of: pid) == namespace,
                let start = Self.startTime(of: pid),
                let environ = FileManager.default.contents(atPath: "/proc/\(pid)/environ"),
                let variable = environ.split(separator: 0).first(where: { $0.starts(with: prefix) })
            else { continue }
            let owner = String(decoding: variable.dropFirst(prefix.count), as: UTF8.self).split(separator: ":")
            guard owner.count == 2, let ownerPID = Int32(owner[0]), Self.startTime(of: ownerPID) != String(owner[1])
            else { continue }
            // Still the process read above (not a new one that took its pid meanwhile): SIGKILL ends it, stopped
            // or not.
            guard Self.startTime(of: pid) == start else { continue }
            kill(pid, SIGKILL)
            killed += 1
            deadOwners.insert(ownerPID)
        }
        // The throwaway clusters of those dead test processes (TestPostgres names them after the process id).
        let temporary = FileManager.default.temporaryDirectory.path
        for name in (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? [] {
            let parts = name.split(separator: "-")
            guard name.hasPrefix("pushworker-test-"), parts.count >= 3, let pid = Int32(parts[2]),
                deadOwners.contains(pid), Self.startTime(of: pid) == nil
            else { continue }
            try? FileManager.default.removeItem(atPath: temporary + "/" + name)
        }
        if killed > 0 {
            FileHandle.standardError.write(
                Data("killed \(killed) processes an earlier test run left behind (its process died)\n".utf8)
            )
        }
    }
}
