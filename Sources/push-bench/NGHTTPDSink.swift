import ArgumentParser
import Foundation
import PushProcess

/// Debian's nghttpd (nghttp2-server, a C HTTP/2 server) as the APNs stand-in for throughput: over TLS it
/// answers 200 to `POST /3/device/<token>` from an empty file per token under its document root. Far
/// cheaper per request than the simulator, so the worker's own cost is what the figures show.
struct NGHTTPDSink {
    let process: ChildProcess.Running
    let port: Int
    /// Its self-signed certificate (for `localhost`), to pass as `--apns-ca-file`.
    let caFile: String

    /// Starts nghttpd answering for the tokens `%064x` of 0...`tokens`.
    static func start(directory: String, tokens: Int) throws -> NGHTTPDSink {
        let root = directory + "/htdocs"
        let devices = root + "/3/device"
        try FileManager.default.createDirectory(atPath: devices, withIntermediateDirectories: true)
        for n in 0...tokens {
            _ = FileManager.default.createFile(atPath: devices + "/" + String(format: "%064x", n), contents: nil)
        }
        // FCM too: the token endpoint and one project's send path answer a grant and a message name.
        try FileManager.default.createDirectory(
            atPath: root + "/v1/projects/push-simulator",
            withIntermediateDirectories: true
        )
        _ = FileManager.default.createFile(
            atPath: root + "/token",
            contents: Data(#"{"access_token":"bench-token","expires_in":3600,"token_type":"Bearer"}"#.utf8)
        )
        _ = FileManager.default.createFile(
            atPath: root + "/v1/projects/push-simulator/messages:send",
            contents: Data(#"{"name":"projects/push-simulator/messages/0:1"}"#.utf8)
        )
        let key = directory + "/sink-key.pem"
        let certificate = directory + "/sink-cert.pem"
        let made = try ChildProcess.run(
            "/usr/bin/env",
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=localhost",
                "-addext", "subjectAltName=DNS:localhost",
            ]
        )
        guard made.status == 0 else {
            throw ValidationError("openssl could not make the sink's certificate: \(made.output)")
        }
        let port = try freePort()
        let process = try ChildProcess.start(
            "/usr/bin/env",
            ["nghttpd", "--htdocs=" + root, String(port), key, certificate],
            environment: [:],
            outputPath: directory + "/nghttpd.log"
        )
        // Ready once it accepts TCP.
        for _ in 0..<100 {
            if canConnect(port: port) { return NGHTTPDSink(process: process, port: port, caFile: certificate) }
            usleep(50_000)
        }
        process.signal(SIGKILL)
        throw ValidationError(
            "nghttpd did not start (apt-get install -y nghttp2-server): \(process.output.suffix(500))"
        )
    }

    func stop() {
        self.process.signal(SIGKILL)
        _ = self.process.wait()
    }
}

/// A TCP port free on 127.0.0.1 now.
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
        }
    }
    guard bound else { throw ValidationError("no free TCP port on 127.0.0.1") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether something accepts TCP on 127.0.0.1:`port`.
func canConnect(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
        }
    }
}
