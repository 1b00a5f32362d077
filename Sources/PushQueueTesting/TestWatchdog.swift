import Foundation
import PushProcess
import Synchronization

/// Keeps a test run's output current and its length bounded.
///
/// Test output to a pipe is block-buffered, so a run that hangs shows a log cut at a 4 KiB boundary, tests
/// before the one that hangs. Every second this flushes the process's output streams; and a run longer
/// than `PUSH_TEST_RUN_LIMIT_MINUTES` (30 by default, the quick run takes about 7; 180 with
/// `PUSH_LONG_TESTS=1`) says so and exits 1, so CI reports a failure at the test that was running
/// instead of a silent timeout.
///
/// Before it exits it prints what a hang needs to be diagnosed from CI's log alone: every thread's stack
/// (gdb, when installed), then the reports fixtures registered (the test cluster's sessions that are not
/// idle and what they wait for, the running workers' last log lines), the shortest and most telling last.
public enum TestWatchdog {
    private static let started: Bool = {
        TestOrphans.markAndSweep()
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
                    TestWatchdog.write(
                        "\nThe test run is still going after \(minutes) minutes: what it is doing now.\n"
                    )
                    // The reports first (gdb stops the whole process, and may be slow), printed after the stacks.
                    let reports = TestWatchdog.reports.withLock { $0.sorted { $0.key < $1.key }.map(\.value) }
                    let texts = reports.map { $0.text() }
                    TestWatchdog.write(TestWatchdog.threadStacks())
                    for text in texts { TestWatchdog.write(text) }
                    // The fixtures' workers would outlive this process (their database gone, retrying).
                    for report in reports { report.onExit?() }
                    TestWatchdog.write(
                        """

                        The test run is still going after \(minutes) minutes (PUSH_TEST_RUN_LIMIT_MINUTES): \
                        it is stopped here. The last test started above is the one that hangs.

                        """
                    )
                    exit(1)
                }
            }
        }
        thread.name = "push-test-watchdog"
        thread.start()
        return true
    }()

    private struct Report: Sendable {
        var text: @Sendable () -> String
        var onExit: (@Sendable () -> Void)?
    }
    private static let reports = Mutex<[UInt64: Report]>([:])
    private static let nextReport = Atomic<UInt64>(0)

    /// Starts the watchdog once per test process (the first test database starts it; suites without a
    /// database call it themselves).
    public static func start() { _ = self.started }

    /// Adds a report printed if the run limit is reached (it runs on the watchdog's thread, so it must not
    /// wait on the test's event loops or tasks: run a command with a limit instead). Remove it with
    /// ``removeReport(_:)`` when what it describes is gone. `onExit` runs after every report is printed,
    /// before the process exits: it stops what would outlive it (a fixture's workers).
    public static func addReport(
        _ report: @escaping @Sendable () -> String,
        onExit: (@Sendable () -> Void)? = nil
    ) -> UInt64 {
        let id = self.nextReport.add(1, ordering: .relaxed).newValue
        self.reports.withLock { $0[id] = Report(text: report, onExit: onExit) }
        return id
    }

    public static func removeReport(_ id: UInt64) {
        _ = self.reports.withLock { $0.removeValue(forKey: id) }
    }

    private static func write(_ text: String) {
        FileHandle.standardError.write(Data(text.utf8))
    }

    /// Every thread's innermost frames, names demangled, addresses, arguments and directories left out;
    /// a thread idle in its event loop or its pool (the usual state) is one line. An event loop or a
    /// cooperative thread blocked in a lock or a system call shows here (a task suspended in an `await`
    /// does not: the database report shows what a query waits for).
    static func threadStacks() -> String {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/gdb") else {
            return "(thread stacks: gdb is not installed)\n"
        }
        // While gdb is attached every thread here is stopped, this one too: its own time limit (timeout)
        // must bound it, and a SIGCONT afterwards makes sure nothing stays stopped.
        let script = """
            timeout -k 5 60 gdb -p \(getpid()) -batch -ex 'set print frame-arguments none' \\
              -ex 'thread apply all bt 12' 2>/dev/null | { swift demangle --simplified 2>/dev/null || cat; }
            kill -CONT \(getpid())
            """
        guard let result = try? ChildProcess.run("/bin/sh", ["-c", script], limit: .seconds(90)),
            result.output.contains("Thread ")
        else {
            return "(thread stacks: gdb could not attach to the test process)\n"
        }
        var threads: [(name: String, frames: [String])] = []
        for line in result.output.split(separator: "\n") {
            if line.hasPrefix("Thread ") {
                threads.append((String(line.prefix(100)), []))
            } else if line.hasPrefix("#"), !threads.isEmpty {
                threads[threads.count - 1].frames.append(Self.compactFrame(String(line)))
            }
        }
        // Waiting for work: an event loop in epoll, a pool thread on its semaphore, the main thread, this one.
        let idleMarks = [
            "Epoll.epoll_wait", "_dispatch_semaphore_wait_slow", "_dispatch_mgr_thread", "_dispatch_sigsuspend",
            "threadStacks",
        ]
        var idle = 0
        var text = "thread stacks (gdb), idle ones counted:\n"
        for thread in threads {
            if idleMarks.contains(where: { mark in thread.frames.contains { $0.contains(mark) } }) {
                idle += 1
                continue
            }
            text += thread.name + "\n" + thread.frames.map { "  " + $0 + "\n" }.joined()
        }
        return text + "\(idle) threads idle in an event loop, the thread pool or this watchdog\n"
    }

    /// `#3  0x… in f(…) in /long/path/File.swift:12` → `#3 f(…) File.swift:12`.
    private static func compactFrame(_ line: String) -> String {
        let line = line.replacing(/\ \((?:\w+=\.\.\.(?:, )?)*\)/, with: "")
        var words = line.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        if words.count > 2, words[1].hasPrefix("0x"), words[2] == "in" { words.removeSubrange(1...2) }
        if let last = words.last, last.contains("/") {
            words[words.count - 1] = String(last.split(separator: "/").last ?? "")
            if words.count > 2, words[words.count - 2] == "in" || words[words.count - 2] == "at" {
                words.remove(at: words.count - 2)
            }
        }
        return String(words.joined(separator: " ").prefix(200))
    }
}
