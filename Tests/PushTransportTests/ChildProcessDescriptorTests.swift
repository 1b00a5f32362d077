import Foundation
import NIOCore
import NIOPosix
import PushProcess
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Child processes inherit nothing but their standard streams")
struct ChildProcessDescriptorTests {
    /// SwiftNIO opens sockets without close-on-exec. A child started while a connection is open used to keep
    /// it: the peer (a Postgres backend) never saw the close, and a frozen-worker test waited 30 s for a
    /// session it had closed.
    @Test(
        "a child started while a socket is open does not hold it: its descriptors are 0, 1 and 2, and closing the socket here ends the connection at once"
    )
    func nothingInherited() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let closedByPeer = Arc()
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.closeFuture.whenComplete { _ in closedByPeer.flag.withLock { $0 = true } }
                return channel.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let client = try await ClientBootstrap(group: group).connect(to: server.localAddress!).get()
        // A plain descriptor opened without close-on-exec, as C libraries do.
        let plain = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(plain > 2)

        let log = FileManager.default.temporaryDirectory.appendingPathComponent("child-\(getpid()).log").path
        defer { unlink(log) }
        let child = try ChildProcess.start("/bin/sleep", ["30"], environment: [:], outputPath: log)
        defer {
            kill(child.pid, SIGKILL)
            _ = child.wait(limit: .seconds(5))
        }
        // Right after exec the dynamic loader briefly holds its own (ld.so.cache, libc) at 3 and up: wait for
        // those to close. An inherited descriptor never does.
        var descriptors: [Int32] = []
        for _ in 0..<100 {
            descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(child.pid)/fd")
                .compactMap { Int32($0) }.sorted()
            if descriptors == [0, 1, 2] { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(descriptors == [0, 1, 2], "the child holds descriptors of its parent: \(descriptors)")

        try await client.close()
        close(plain)
        let deadline = ContinuousClock.now + .seconds(5)
        while !closedByPeer.flag.withLock({ $0 }) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let ended = closedByPeer.flag.withLock { $0 }
        #expect(ended, "the server still had the connection 5 s after the client closed it: the child holds it")
        try await server.close()
        try await group.shutdownGracefully()
    }
}

private final class Arc: Sendable {
    let flag = Mutex(false)
}
