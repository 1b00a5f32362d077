public import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Tells a service manager about the daemon's life with the `sd_notify` protocol (systemd's
/// `Type=notify`): one datagram per state change (`READY=1`, `STATUS=…`, `STOPPING=1`, `WATCHDOG=1`) to
/// the Unix socket named by `$NOTIFY_SOCKET`. Without that variable every call does nothing, so the
/// daemon behaves the same outside systemd. No libsystemd: the protocol is a datagram of text.
public struct ServiceManagerNotifier: Sendable {
    /// The socket path from `$NOTIFY_SOCKET` (`@` first means the abstract namespace); `nil` outside systemd.
    public let socketPath: String?
    /// How often systemd expects `WATCHDOG=1` (`$WATCHDOG_USEC`, when `$WATCHDOG_PID` is unset or ours).
    public let watchdogInterval: Duration?

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        let path = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        self.socketPath = path
        var interval: Duration?
        if path != nil, let text = environment["WATCHDOG_USEC"], let usec = Int64(text), usec > 0,
            environment["WATCHDOG_PID"].map({ $0 == String(getpid()) }) ?? true
        {
            interval = .microseconds(usec)
        }
        self.watchdogInterval = interval
    }

    /// Whether a service manager is listening.
    public var isActive: Bool { self.socketPath != nil }

    /// Sends one notification (newline-separated `KEY=value` lines). Returns whether it was sent; a
    /// failure is not fatal: the daemon works the same, systemd only learns less.
    @discardableResult
    public func notify(_ assignments: String) -> Bool {
        guard let path = self.socketPath else { return false }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(path.utf8)
        let abstract = pathBytes.first == UInt8(ascii: "@")
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard pathBytes.count < capacity else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: pathBytes)
            if abstract { raw[0] = 0 }
        }
        // An abstract address is exactly its bytes; a path address includes its terminating NUL.
        let length = socklen_t(
            MemoryLayout<sockaddr_un>.offset(of: \sockaddr_un.sun_path)! + pathBytes.count + (abstract ? 0 : 1)
        )
        #if canImport(Glibc)
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        #else
        let fd = socket(AF_UNIX, SOCK_DGRAM, 0)
        #endif
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let message = Array(assignments.utf8)
        let sent = message.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                    sendto(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL), socketAddress, length)
                }
            }
        }
        return sent == message.count
    }

    /// Sends `WATCHDOG=1` at half the interval systemd asked for, until the task is cancelled. Returns
    /// at once when no watchdog is configured. Driven by the task scheduler, so a wedged process stops
    /// pinging and systemd restarts it.
    public func runWatchdog() async {
        guard let interval = self.watchdogInterval else { return }
        while !Task.isCancelled {
            self.notify("WATCHDOG=1")
            try? await Task.sleep(for: interval / 2)
        }
    }
}
