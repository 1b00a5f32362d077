import Foundation
import PushProcess
import Testing

/// The tests' own process runner: a child that hangs ends with a reason, it never hangs the run.
@Suite("Child processes within a limit")
struct ChildProcessTests {
    @Test("a command past its limit is stopped with SIGTERM, one that ignores SIGTERM with SIGKILL; both say so")
    func stoppedPastTheLimit() throws {
        let started = ContinuousClock.now
        let polite = try ChildProcess.run("/bin/sleep", ["30"], limit: .milliseconds(300))
        #expect(polite.status == 128 + SIGTERM)
        #expect(polite.output.contains("[stopped: still running"))
        // Two seconds: the shell must have set its trap before the SIGTERM comes.
        let stubborn = try ChildProcess.run("/bin/sh", ["-c", "trap '' TERM; exec sleep 30"], limit: .seconds(2))
        #expect(stubborn.status == 128 + SIGKILL)
        #expect(stubborn.output.contains("[stopped: still running"))
        #expect(ContinuousClock.now - started < .seconds(12))
        // One that handles the SIGTERM and exits 0 was still stopped: never a success.
        let drained = try ChildProcess.run(
            "/bin/sh",
            ["-c", "trap 'kill $!; exit 0' TERM; sleep 30 & wait"],
            limit: .seconds(2)
        )
        #expect(drained.status == 124, "\(drained.output)")
        let quick = try ChildProcess.run("/bin/sh", ["-c", "echo done; exit 3"])
        #expect(quick.status == 3 && quick.output == "done\n", "a command within its limit is untouched")
    }
}
