import Foundation
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// Headless Chromium (Debian's `chromium`) loads every page of the console: each must render (a screenshot is
/// saved) without a single console message, since the pages run no script, any message is an error: a
/// Content-Security-Policy violation, a resource that failed to load.
///
/// Screenshots go to `.build/console-screenshots/`; with `UPDATE_SCREENSHOTS=1` the overview and the dead
/// letters also replace `docs/console-overview.png` and `docs/console-dead-letters.png`.
@Suite(.serialized) struct BrowserTests {
    static var chromium: String? {
        if let path = ProcessInfo.processInfo.environment["CHROMIUM"], !path.isEmpty { return path }
        return ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test(
        .enabled(
            if: chromium != nil,
            "no Chromium: apt-get install -y chromium (bash .ci/run installs it), or set CHROMIUM to a browser binary"
        )
    )
    func everyPageRendersInChromiumWithoutConsoleErrors() async throws {
        // A browser: at most a few heavy tests at once (HeavyTestGate).
        try await HeavyTestGate.run(expected: .seconds(15)) {
            try await self.everyPageRendersInChromiumWithoutConsoleErrorsNow()
        }
    }

    private func everyPageRendersInChromiumWithoutConsoleErrorsNow() async throws {
        let browser = try #require(Self.chromium)
        let output = Self.repository.appendingPathComponent(".build/console-screenshots").path
        try FileManager.default.createDirectory(atPath: output, withIntermediateDirectories: true)
        // A quick start first: a browser that cannot start here (no sandbox support, missing libraries) is a
        // skip with its reason, not a failure of the console.
        let probe = try await Self.run(browser, ["--dump-dom", "data:text/html,<p>ok</p>"])
        guard probe.status == 0, probe.output.contains("<p>ok</p>") else {
            print(
                "SKIPPED everyPageRendersInChromiumWithoutConsoleErrors: Chromium did not start: \(probe.output.suffix(600))"
            )
            return
        }
        // The detector itself: a page breaking its own CSP must produce a console message here.
        let violation = try await Self.run(
            browser,
            [
                "--dump-dom",
                "data:text/html,<meta http-equiv=\"Content-Security-Policy\" content=\"style-src 'self'\"><p style=\"color:red\">x</p>",
            ]
        )
        #expect(violation.output.contains(":CONSOLE"), "Chromium printed no console message for a CSP violation")
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger, delivered: 3_000, dead: 60)
            let deadID = try await db.int64("SELECT min(id) FROM push.dead_jobs WHERE reason = 'Unregistered'")
            let jobID = try await db.int64("SELECT min(id) FROM push.jobs WHERE state = 'delivered'")
            try await withConsole(db, token: consoleToken) { port in
                // Pages past the overview need a session: Chromium reaches the console through Debian's tinyproxy,
                // which adds the signed-in operator's cookie to every request (a headless run keeps no cookie
                // of its own). Without tinyproxy, only the anonymous overview is rendered.
                let (cookie, _) = try await signIn(port: port, name: "browser")
                let proxy = try await Self.startCookieProxy(cookie: cookie)
                defer {
                    proxy?.0.signal(SIGTERM)
                    _ = proxy?.0.wait(limit: .seconds(10))
                }
                let proxyFlags =
                    proxy.map { ["--proxy-server=http://127.0.0.1:\($0.1)", "--proxy-bypass-list=<-loopback>"] } ?? []
                var pages: [(name: String, path: String, mustShow: String, flags: [String])] = [
                    ("overview-anonymous", "/", "Sign in</a> to see dead letters", [])
                ]
                let signedIn: [(String, String, String)] = [
                    ("overview", "/", "Last hour"),
                    ("dead-letters", "/dead", "By reason and trap id"),
                    ("dead-letter", "/dead/\(deadID)", "Dead letter \(deadID)"),
                    ("job", "/jobs/\(jobID)", "Job \(jobID)"),
                    ("replay-preview", "/dead/replay?trap=MS020", "Dry run: nothing has moved"),
                    ("purge-preview", "/dead/purge?older_than=1h", "Dry run: nothing is deleted"),
                    ("sign-in", "/login", "Console token"),
                ]
                if proxy == nil { print("no tinyproxy: only the anonymous overview is rendered in Chromium") }
                if proxy != nil { pages += signedIn.map { ($0.0, $0.1, $0.2, proxyFlags) } }
                for page in pages {
                    let url = "http://127.0.0.1:\(port)\(page.path)"
                    let png = "\(output)/\(page.name).png"
                    try? FileManager.default.removeItem(atPath: png)
                    let shot = try await Self.run(
                        browser,
                        page.flags + ["--window-size=1280,1400", "--screenshot=\(png)", url]
                    )
                    #expect(shot.status == 0, "\(page.name): \(shot.output.suffix(500))")
                    let bytes = try Data(contentsOf: URL(fileURLWithPath: png))
                    #expect(bytes.starts(with: [0x89, 0x50, 0x4E, 0x47]) && bytes.count > 10_000, "\(page.name)")
                    let dom = try await Self.run(browser, page.flags + ["--dump-dom", url])
                    #expect(dom.output.contains(page.mustShow), "\(page.name) did not render its content")
                    for run in [shot, dom] {
                        let messages = run.output.split(separator: "\n").filter { $0.contains(":CONSOLE") }
                        #expect(messages.isEmpty, "\(page.name): console messages: \(messages.joined(separator: "\n"))")
                    }
                }
                if ProcessInfo.processInfo.environment["UPDATE_SCREENSHOTS"] == "1" {
                    for name in ["overview", "dead-letters"] {
                        let target = Self.repository.appendingPathComponent("docs/console-\(name).png").path
                        try? FileManager.default.removeItem(atPath: target)
                        try FileManager.default.copyItem(atPath: "\(output)/\(name).png", toPath: target)
                    }
                }
            }
        }
    }

    /// Debian's tinyproxy on a free loopback port, adding `Cookie: cookie` to every request it forwards; `nil`
    /// when tinyproxy is not installed.
    static func startCookieProxy(cookie: String) async throws -> (ChildProcess.Running, Int)? {
        guard TinyProxy.binary != nil else { return nil }
        let directory = NSTemporaryDirectory() + "/pw-cookie-proxy-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return try await TinyProxy.start(in: directory, extraConfig: ["AddHeader \"Cookie\" \"\(cookie)\""])
    }

    /// Chromium with ``flags`` and `arguments`, at most 60 s, off the concurrency pool.
    static func run(_ browser: String, _ arguments: [String]) async throws -> ChildProcess.Result {
        try await offPool { try ChildProcess.run("/usr/bin/timeout", ["-k", "5", "60", browser] + flags + arguments) }
    }

    /// Headless, no GPU, console messages on stderr; no sandbox when root (Chromium refuses it otherwise).
    static var flags: [String] {
        [
            "--headless=new", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--disable-extensions",
            "--enable-logging=stderr", "--v=0", "--user-data-dir=\(NSTemporaryDirectory())/pw-chromium-\(getpid())",
        ] + (geteuid() == 0 ? ["--no-sandbox"] : [])
    }
}
