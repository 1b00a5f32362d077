import Foundation
public import PushProcess

/// Debian's tinyproxy (a real HTTP CONNECT proxy) on a free loopback port, for tests of what goes through a
/// proxy. Its log (`LogLevel Connect`: one line per CONNECT) is `directory/tinyproxy.log`.
public enum TinyProxy {
    /// The installed binary, or `nil` (`apt-get install tinyproxy`; `.ci/run` installs it).
    public static var binary: String? {
        ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    public struct NotInstalled: Error, CustomStringConvertible {
        public var description: String { "tinyproxy is not installed: apt-get install tinyproxy (.ci/run does)" }
    }

    /// Starts it in `directory` with `extraConfig` lines (`BasicAuth user password`, `AddHeader …`) and waits
    /// until it listens; returns it and its port.
    public static func start(
        in directory: String,
        extraConfig: [String] = []
    ) async throws -> (proxy: ChildProcess.Running, port: Int) {
        guard let binary = self.binary else { throw NotInstalled() }
        let probe = try ChildProcess.run(
            "/usr/bin/env",
            ["python3", "-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"]
        )
        guard let port = Int(probe.output.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "no free port: \(probe.output)"])
        }
        let config = directory + "/tinyproxy.conf"
        let lines =
            [
                "Port \(port)", "Listen 127.0.0.1", "Timeout 60", "MaxClients 50", "LogLevel Connect",
                "Allow 127.0.0.1", "DisableViaHeader Yes",
            ] + extraConfig
        try (lines.joined(separator: "\n") + "\n").write(toFile: config, atomically: true, encoding: .utf8)
        let proxy = try ChildProcess.start(
            binary,
            ["-d", "-c", config],
            environment: [:],
            outputPath: directory + "/tinyproxy.log"
        )
        for _ in 0..<50 where !proxy.output.contains("Reloading config file finished") {
            try await Task.sleep(for: .milliseconds(100))
        }
        try await Task.sleep(for: .milliseconds(200))
        return (proxy, port)
    }
}
