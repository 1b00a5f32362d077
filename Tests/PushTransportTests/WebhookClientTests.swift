import Foundation
import NIOPosix
import PushProcess
import PushQueueTesting
import Testing

@testable import PushTransport

/// The webhook client against a loopback receiver in Python (real sockets): it refuses private addresses
/// unless allowed, never follows a redirect, takes a 2xx head as the answer, and keeps one deadline.
@Suite("Webhook client: receivers are not trusted")
struct WebhookClientTests {
    static let server = """
        import http.server, socket, sys, time
        log = open(sys.argv[1], "a", buffering=1)
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *a): pass
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                log.write(self.path + " " + self.headers.get("Host", "") + "\\n")
                if self.path == "/hang":
                    time.sleep(10); return
                if self.path == "/gone-stall":
                    self.wfile.write(b"HTTP/1.1 410 Gone\\r\\nContent-Length: 100\\r\\n\\r\\nno more"); self.wfile.flush()
                    time.sleep(10); return
                if self.path == "/stall":
                    self.wfile.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 100\\r\\n\\r\\npartial"); self.wfile.flush()
                    time.sleep(10); return
                status = {"/ok": 204, "/redirect": 302, "/error": 500}[self.path.split("?")[0]]
                self.send_response(status)
                if status == 302: self.send_header("Location", "http://169.254.169.254/latest/meta-data")
                body = b"database is down" if status == 500 else b""
                self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H); s.daemon_threads = True
        if len(sys.argv) > 3:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain(sys.argv[2], sys.argv[3])
            s.socket = context.wrap_socket(s.socket, server_side=True)
        print(s.server_address[1], flush=True); s.serve_forever()
        """

    /// Starts ``server`` with `arguments` (the log file, then optionally a certificate and key for TLS) and
    /// waits for the port it prints.
    static func startReceiver(in directory: String, _ arguments: [String]) async throws -> (ChildProcess.Running, Int) {
        let receiver = try ChildProcess.start(
            "/usr/bin/env",
            ["python3", "-c", Self.server] + arguments,
            environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"],
            outputPath: directory + "/out"
        )
        for _ in 0..<100 {
            if let port = Int(receiver.output.trimmingCharacters(in: .whitespacesAndNewlines)) {
                return (receiver, port)
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        receiver.signal(SIGKILL)
        _ = receiver.wait(limit: .seconds(10))
        Issue.record("the receiver did not start: \(receiver.output)")
        throw CancellationError()
    }

    @Test(
        "a loopback receiver is refused without --webhooks-allow-private (no connection made); with it: 2xx, a redirect answered not followed, a 500 with its body's start, a stalled body after a 200 head, a silent receiver past the deadline"
    )
    func untrusted() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("hook-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let log = directory + "/requests.log"
        let (receiver, port) = try await Self.startReceiver(in: directory, [log])
        defer {
            receiver.signal(SIGKILL)
            _ = receiver.wait(limit: .seconds(10))
        }
        let group = MultiThreadedEventLoopGroup.singleton
        let body = Array(#"{"job_id":1}"#.utf8)
        let strict = try WebhookHTTPClient(
            group: group,
            allowPrivate: false,
            timeout: .seconds(2),
            clock: ContinuousClock()
        )
        for url in [
            "http://127.0.0.1:\(port)/ok", "http://localhost:\(port)/ok", "http://[::ffff:127.0.0.1]:\(port)/ok",
        ] {
            do {
                _ = try await strict.post(url: url, headers: [], body: body)
                Issue.record("\(url) was reached")
            } catch {
                #expect(
                    error.kind == .refusedAddress && error.description.contains("--webhooks-allow-private"),
                    "\(error)"
                )
            }
        }
        #expect((try? String(contentsOfFile: log, encoding: .utf8)) ?? "" == "", "no request reached the receiver")

        // 8 s: a loaded test machine's Python receiver can take seconds to answer; the receiver's silent paths
        // sleep 10 s, past it.
        let client = try WebhookHTTPClient(
            group: group,
            allowPrivate: true,
            timeout: .seconds(8),
            clock: ContinuousClock()
        )
        let ok = try await client.post(url: "http://localhost:\(port)/ok?token=t", headers: [], body: body)
        #expect(ok.status == 204)
        let redirect = try await client.post(url: "http://127.0.0.1:\(port)/redirect", headers: [], body: body)
        #expect(redirect.status == 302 && redirect.location == "http://169.254.169.254/latest/meta-data")
        let error = try await client.post(url: "http://127.0.0.1:\(port)/error", headers: [], body: body)
        #expect(error.status == 500 && error.bodyPrefix == "database is down")
        let started = ContinuousClock.now
        let stalled = try await client.post(url: "http://127.0.0.1:\(port)/stall", headers: [], body: body)
        #expect(stalled.status == 200, "a 2xx head is the answer, whatever the body does")
        #expect(ContinuousClock.now - started < .seconds(5), "taken at the head, not at the 8 s deadline")
        let gone = try await client.post(url: "http://127.0.0.1:\(port)/gone-stall", headers: [], body: body)
        #expect(gone.status == 410 && gone.bodyPrefix == "no more", "another status stands after a second's grace")
        do {
            _ = try await client.post(url: "http://127.0.0.1:\(port)/hang", headers: [], body: body)
            Issue.record("a silent receiver answered")
        } catch {
            #expect(error.kind == .timeout, "\(error)")
        }
        let lines = ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(
            lines.count == 6 && !lines.contains { $0.hasPrefix("/latest") },
            "the redirect was not followed: \(lines)"
        )
        #expect(lines.first == "/ok?token=t localhost:\(port)", "path, query and Host as the URL says")

        for (url, kind) in [
            ("http://user:pw@127.0.0.1:\(port)/ok", WebhookHTTPClient.Failure.Kind.badURL),
            ("ftp://127.0.0.1/ok", .badURL),
        ] {
            do {
                _ = try await client.post(url: url, headers: [], body: body)
                Issue.record("\(url) was posted")
            } catch {
                #expect(error.kind == kind && !error.description.contains("pw"), "\(error)")
            }
        }
    }

    @Test(
        "https:// receivers through a CONNECT proxy (Debian's tinyproxy, basic auth), named by address or by name: the tunnel is asked for the address checked here, never the name, TLS verified by name inside it; http:// connects directly; an https:// IP literal is refused with the fix; a private address is refused before the proxy is asked; NO_PROXY connects directly; a proxy wanting credentials says so"
    )
    func proxy() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("hook-proxy-\(UUID().uuidString)")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try TestCertificate.localhost(in: directory)
        let (proxy, proxyPort) = try await TinyProxy.start(in: directory, extraConfig: ["BasicAuth pushuser s3cret"])
        defer {
            proxy.signal(SIGKILL)
            _ = proxy.wait(limit: .seconds(10))
        }
        let plainLog = directory + "/plain.log"
        let secureLog = directory + "/secure.log"
        try FileManager.default.createDirectory(atPath: directory + "/plain", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory + "/secure", withIntermediateDirectories: true)
        let (plain, plainPort) = try await Self.startReceiver(in: directory + "/plain", [plainLog])
        let (secure, securePort) = try await Self.startReceiver(
            in: directory + "/secure",
            [secureLog, directory + "/cert.pem", directory + "/key.pem"]
        )
        defer {
            for receiver in [plain, secure] {
                receiver.signal(SIGKILL)
                _ = receiver.wait(limit: .seconds(10))
            }
        }
        func connects() -> [String] {
            // tinyproxy logs each request line: `Request (file descriptor N): CONNECT host:port HTTP/1.1`.
            proxy.output.split(separator: "\n").compactMap { line in
                line.range(of: "): CONNECT ").map { String(line[$0.upperBound...].prefix { $0 != " " }) }
            }
        }
        let group = MultiThreadedEventLoopGroup.singleton
        let body = Array(#"{"job_id":1}"#.utf8)
        let read = { (path: String) in
            ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }
        let client = { (proxy: HTTPSProxy, allowPrivate: Bool) in
            try WebhookHTTPClient(
                group: group,
                allowPrivate: allowPrivate,
                caFile: directory + "/cert.pem",
                timeout: .seconds(8),
                proxy: proxy,
                clock: ContinuousClock()
            )
        }
        // The proxy named by its address, then by a name (localhost), which the client looks up itself and
        // connects to one address at a time, each connection with its own tunnel.
        for proxyHost in ["127.0.0.1", "localhost"] {
            let through = try client(try HTTPSProxy(url: "http://pushuser:s3cret@\(proxyHost):\(proxyPort)"), true)
            let before = connects().count
            let tls = try await through.post(url: "https://localhost:\(securePort)/ok", headers: [], body: body)
            #expect(tls.status == 204, "via \(proxyHost)")
            let asked = connects().dropFirst(before)
            #expect(asked.contains("127.0.0.1:\(securePort)"), "via \(proxyHost): \(asked)")
            #expect(!asked.contains { $0.hasPrefix("localhost") }, "the proxy was never given the name: \(asked)")
        }
        #expect(read(secureLog) == ["/ok localhost:\(securePort)", "/ok localhost:\(securePort)"])
        let through = try client(try HTTPSProxy(url: "http://pushuser:s3cret@127.0.0.1:\(proxyPort)"), true)
        let asked = connects().count

        // A plain http:// receiver connects directly, as curl reads HTTPS_PROXY.
        #expect(try await through.post(url: "http://localhost:\(plainPort)/ok", headers: [], body: body).status == 204)
        #expect(connects().count == asked && read(plainLog) == ["/ok localhost:\(plainPort)"])

        // An https:// hook given as an IP address: TLS could not verify it against a tunnel's peer (the proxy).
        do {
            _ = try await through.post(url: "https://127.0.0.1:\(securePort)/ok", headers: [], body: body)
            Issue.record("an https:// IP address was posted through the proxy")
        } catch {
            #expect(error.kind == .tls && error.description.contains("NO_PROXY"), "\(error)")
        }

        // Without --webhooks-allow-private the address is refused here: the proxy is not asked.
        let strict = try client(try HTTPSProxy(url: "http://pushuser:s3cret@127.0.0.1:\(proxyPort)"), false)
        do {
            _ = try await strict.post(url: "https://localhost:\(securePort)/ok", headers: [], body: body)
            Issue.record("a private address was posted through the proxy")
        } catch {
            #expect(error.kind == .refusedAddress, "\(error)")
        }
        #expect(connects().count == asked, "the proxy saw no CONNECT for a refused address or an IP literal")

        // NO_PROXY: straight to the receiver.
        let bypassing = try client(
            try HTTPSProxy(url: "http://pushuser:s3cret@127.0.0.1:\(proxyPort)", noProxy: "localhost"),
            true
        )
        #expect(
            try await bypassing.post(url: "https://localhost:\(securePort)/ok", headers: [], body: body).status == 204
        )
        #expect(connects().count == asked, "NO_PROXY connected directly")
        #expect(read(secureLog).count == 3)

        // Wrong credentials: the proxy's 401 (tinyproxy's answer; others send 407), said with the fix, the
        // password never shown.
        let refused = try client(try HTTPSProxy(url: "http://pushuser:wrong-pw@127.0.0.1:\(proxyPort)"), true)
        do {
            _ = try await refused.post(url: "https://localhost:\(securePort)/ok", headers: [], body: body)
            Issue.record("a proxy refusing the credentials let the POST through")
        } catch {
            #expect(
                error.kind == .connect && error.description.contains(" 401 ")
                    && error.description.contains("wants credentials") && !error.description.contains("wrong-pw"),
                "\(error)"
            )
        }
        #expect(read(secureLog).count == 3, "no request reached the receiver past the refusal")
    }

    @Test(
        "an https:// receiver: verified against --webhooks-ca-file with the host name as SNI; without its CA, refused"
    )
    func tls() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("hook-tls-\(UUID().uuidString)")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try TestCertificate.localhost(in: directory)
        let log = directory + "/requests.log"
        let (receiver, port) = try await Self.startReceiver(
            in: directory,
            [log, directory + "/cert.pem", directory + "/key.pem"]
        )
        defer {
            receiver.signal(SIGKILL)
            _ = receiver.wait(limit: .seconds(10))
        }
        let group = MultiThreadedEventLoopGroup.singleton
        let body = Array(#"{"job_id":1}"#.utf8)
        let trusting = try WebhookHTTPClient(
            group: group,
            allowPrivate: true,
            caFile: directory + "/cert.pem",
            timeout: .seconds(8),
            clock: ContinuousClock()
        )
        let answer = try await trusting.post(url: "https://localhost:\(port)/ok", headers: [], body: body)
        #expect(answer.status == 204)
        let untrusting = try WebhookHTTPClient(
            group: group,
            allowPrivate: true,
            timeout: .seconds(8),
            clock: ContinuousClock()
        )
        do {
            _ = try await untrusting.post(url: "https://localhost:\(port)/ok", headers: [], body: body)
            Issue.record("a receiver with an unknown CA was trusted")
        } catch {
            #expect(error.kind == .tls || error.kind == .closed, "\(error)")
        }
        let lines = ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(lines == ["/ok localhost:\(port)"], "only the verified connection carried a request: \(lines)")
    }
}
