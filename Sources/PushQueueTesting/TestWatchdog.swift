import Foundation

/// Keeps a test run's output current and its length bounded.
///
/// Test output to a pipe is block-buffered, so a run that hangs shows a log cut at a 4 KiB boundary, tests
/// before the one that hangs. Every second this flushes the process's output streams; and a run longer
/// than `PUSH_TEST_RUN_LIMIT_MINUTES` (30 by default, the quick run takes about 7; 180 with
/// `PUSH_LONG_TESTS=1`) says so and exits 1, so CI reports a failure at the test that was running
/// instead of a silent timeout.
public enum TestWatchdog {
    private static let started: Bool = {
        // Long mode (ten fault schedules, the 10,000-job storm) may take an hour and more.
        let long = ProcessInfo.processInfo.environment["PUSH_LONG_TESTS"] == "1"
        let given = ProcessInfo.processInfo.environment["PUSH_TEST_RUN_LIMIT_MINUTES"].flatMap { Double($0) }
        let minutes = given.flatMap { $0 > 0 && $0 <= 10_000 ? $0 : nil } ?? (long ? 180 : 30)
        let deadline = ContinuousClock.now + .seconds(minutes * 60)
        let thread = Thread {
            while true {
                Thread.sleep(forTimeInterval: 1)
                fflush(nil)
                if ContinuousClock.now > deadline {
                    FileHandle.standardError.write(
                        Data(
                            """

                            The test run is still going after \(minutes) minutes (PUSH_TEST_RUN_LIMIT_MINUTES): \
                            it is stopped here. The last test started above is the one that hangs.

                            """.utf8
                        )
                    )
                    exit(1)
                }
            }
        }
        thread.name = "push-test-watchdog"
        thread.start()
        return true
    }()

    /// Starts the watchdog once per test process (the first test database starts it; suites without a
    /// database call it themselves).
    public static func start() { _ = self.started }
}
