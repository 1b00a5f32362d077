public import Foundation
public import PushCore

#if canImport(Glibc)
import Glibc
#endif

/// Runs a command to completion with `posix_spawn` and `waitpid`, its output captured in a temporary file.
///
/// Foundation's `Process` on Linux can miss a child's exit when the caller blocks a cooperative thread;
/// this does not depend on a run loop, and a file (not a pipe) cannot be held open by a daemon the
/// command leaves running (`pg_ctl start`). The child starts with no signals blocked.
public enum ChildProcess {
    public struct Result: Sendable {
        public var status: Int32
        public var output: String
    }

    /// Runs the command to completion. One still running after `limit` is stopped (SIGTERM, then SIGKILL):
    /// its status is then 128 + the signal (124 if it exited on its own after the SIGTERM) and its output
    /// ends with a line saying so, so a hung command can never hang its caller.
    public static func run(
        _ executable: String,
        _ arguments: [String],
        limit: Duration = .seconds(300)
    ) throws -> Result {
        let outputPath = FileManager.default.temporaryDirectory
            .appendingPathComponent("push-worker-cmd-\(getpid())-\(UInt64.random(in: 0...UInt64.max)).log").path
        defer { unlink(outputPath) }
        let running = try self.start(executable, arguments, environment: [:], outputPath: outputPath)
        let status = running.wait(limit: limit)
        return Result(status: status, output: running.output)
    }
}

extension ChildProcess {
    /// A command started in the background (the daemon, in end-to-end tests).
    public struct Running: Sendable {
        /// Its process id.
        public var pid: pid_t
        /// Where its standard output and error go.
        public var outputPath: String

        /// Sends a signal (SIGTERM, SIGKILL, …).
        public func signal(_ number: Int32) { kill(self.pid, number) }

        /// Whether it has not exited (an exited child not yet reaped is a zombie: state `Z` in `/proc`).
        public var isRunning: Bool {
            guard let stat = try? String(contentsOfFile: "/proc/\(self.pid)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return false }
            return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
        }

        /// Waits for it to exit and returns its exit code (128 + signal number when killed).
        ///
        /// One still running after `limit` is stopped (SIGTERM, then SIGKILL 5 s later) and reaped, and its
        /// output gains a line saying so: a child that ignores SIGTERM or hangs in its drain fails its
        /// caller with the reason instead of hanging it (a test run, CI, a benchmark).
        public func wait(limit: Duration = .seconds(120)) -> Int32 { self.wait(killingAfter: limit).status }

        /// ``wait(limit:)``, also saying whether the limit was reached and the child killed; `clock` measures
        /// the limit.
        public func wait(
            killingAfter limit: Duration,
            clock: any PushClock = ContinuousClock()
        ) -> (status: Int32, hung: Bool) {
            var hung = false
            let deadline = clock.now + limit
            var status: Int32 = 0
            var pause: UInt32 = 1_000
            while true {
                let reaped = waitpid(self.pid, &status, WNOHANG)
                if reaped == self.pid { break }
                if reaped < 0 {
                    if errno == EINTR { continue }
                    return (-1, false)  // not our child, or already reaped
                }
                if clock.now >= deadline {
                    hung = true
                    // SIGTERM first: a wrapper (runuser, timeout) passes it on to the command it started,
                    // which SIGKILL to the wrapper would leave running. Then SIGKILL.
                    kill(self.pid, SIGTERM)
                    let killAt = clock.now + .seconds(5)
                    var reaped: pid_t
                    repeat {
                        reaped = waitpid(self.pid, &status, WNOHANG)
                        if reaped == 0 { usleep(20_000) }
                    } while (reaped == 0 && clock.now < killAt) || (reaped < 0 && errno == EINTR)
                    // Still ours and unreaped (never signal a pid once reaped: it may be another process's).
                    if reaped == 0 {
                        kill(self.pid, SIGKILL)
                        while waitpid(self.pid, &status, 0) < 0 && errno == EINTR {}
                    }
                    let line = "\n[stopped: still running \(limit) after the wait began]\n"
                    if let handle = FileHandle(forWritingAtPath: self.outputPath) {
                        _ = try? handle.seekToEnd()
                        try? handle.write(contentsOf: Data(line.utf8))
                        try? handle.close()
                    }
                    break
                }
                usleep(pause)
                pause = min(pause * 2, 20_000)
            }
            let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
            // A child that handled the SIGTERM and exited 0 was still stopped: never report that as success.
            return (hung && code < 128 ? 124 : code, hung)
        }

        /// Everything it printed so far.
        public var output: String { (try? String(contentsOfFile: self.outputPath, encoding: .utf8)) ?? "" }
    }

    /// Starts `executable` with `arguments` and extra `environment` variables, without waiting.
    public static func start(
        _ executable: String,
        _ arguments: [String],
        environment extra: [String: String],
        outputPath: String
    ) throws -> Running {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        // Threads of this process block signals; a child inherits the mask, and pgbench's -T timer or
        // postgres' own handlers need them. Start the child with an empty mask and default handlers.
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Nothing else of this process reaches the child. SwiftNIO opens its sockets without close-on-exec:
        // a child started while a Postgres session or an APNs connection is open would keep that socket
        // alive after this process closes it (the server never sees the session end), and a long-lived
        // child (Postgres started by `pg_ctl`, a worker under test) would hold it for its whole life.
        closeInheritedDescriptors(&actions)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var environment = ProcessInfo.processInfo.environment
        // systemd's notify socket belongs to this process: a child (Postgres is built with systemd
        // support) must not report READY=1 or STOPPING=1 in its name.
        for key in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] { environment.removeValue(forKey: key) }
        for (key, value) in extra { environment[key] = value }
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for pointer in envp { free(pointer) } }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard spawned == 0 else {
            throw SpawnError(executable: executable, errno: spawned)
        }
        return Running(pid: pid, outputPath: outputPath)
    }
}

/// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34+), which Swift's Glibc module does not export:
/// looked up once at run time.
private let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, CInt) -> CInt)? = {
    guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return nil }
    return unsafeBitCast(
        symbol,
        to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, CInt) -> CInt).self
    )
}()

/// Has the child close every descriptor from 3 up. On a C library without `addclosefrom`, marks this
/// process's open descriptors close-on-exec instead (one opened meanwhile by another thread may still leak).
private func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
    if let addCloseFrom, addCloseFrom(&actions, 3) == 0 { return }
    guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return }
    for name in names {
        guard let descriptor = Int32(name), descriptor > 2 else { continue }
        let flags = fcntl(descriptor, F_GETFD)
        if flags >= 0 { _ = fcntl(descriptor, F_SETFD, flags | FD_CLOEXEC) }
    }
}

/// A command that could not be started: which, and the system's reason.
public struct SpawnError: Error, CustomStringConvertible {
    /// The executable's path.
    public var executable: String
    /// `posix_spawn`'s error number.
    public var errno: Int32

    public var description: String { "could not start \(self.executable): \(String(cString: strerror(self.errno)))" }
}
