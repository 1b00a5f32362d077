import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// The client side of ``HealthServer``: one `GET` with a deadline, for container health checks
/// (`push-worker healthcheck`), where the runtime image has no curl.
public enum HealthProbe {
    /// What the probe could not do.
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    static func reason(_ error: any Error) -> String {
        if let connection = error as? NIOConnectionError, let first = connection.connectionErrors.first {
            return Self.reason(first.error)
        }
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        if error is ChannelError { return "connect timed out" }
        return "\(error)"
    }

    /// GETs `path` from `host:port` and returns the status and body. Throws ``Failure`` when the
    /// endpoint cannot be reached or does not answer within `timeout`.
    public static func get(
        host: String,
        port: Int,
        path: String,
        timeout: Duration = .seconds(3)
    ) async throws -> (status: Int, body: String) {
        let channel: NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>
        do {
            channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.init(timeout))
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                            wrappingChannelSynchronously: channel
                        )
                    }
                }
        } catch {
            throw Failure(
                description:
                    "cannot connect to http://\(host):\(port) (\(Self.reason(error))); is push-worker run listening there with this --metrics-port?"
            )
        }
        return try await withThrowingTaskGroup(of: (status: Int, body: String)?.self) { group in
            group.addTask {
                try await channel.executeThenClose { inbound, outbound in
                    let headers = HTTPHeaders([("host", "\(host):\(port)"), ("connection", "close")])
                    // The server answers on the request head and closes (connection: close), so writing
                    // the end of the request may already fail: the answer, if it came, still counts.
                    var writeError: (any Error)?
                    do {
                        try await outbound.write(contentsOf: [
                            .head(HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)),
                            .end(nil),
                        ])
                    } catch {
                        writeError = error
                    }
                    var status = 0
                    var body = ByteBuffer()
                    do {
                        for try await part in inbound {
                            switch part {
                            case .head(let head): status = Int(head.status.code)
                            case .body(var chunk): body.writeBuffer(&chunk)
                            case .end: return (status, String(buffer: body))
                            }
                        }
                    } catch  where status != 0 {
                        // Closed right after the answer: keep it.
                    }
                    if status == 0, let writeError { throw writeError }
                    return (status, String(buffer: body))
                }
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let result = first else {
                channel.channel.close(promise: nil)
                throw Failure(description: "http://\(host):\(port)\(path) did not answer within \(timeout)")
            }
            return result
        }
    }
}
