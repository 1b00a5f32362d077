import NIOCore
import NIOHTTP1
import Synchronization

/// Whether a host is an IP address literal (no SNI is sent for one).
enum IPAddressLiteral {
    static func isLiteral(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }
}

/// Reads the answer's head and the start of its body, then completes the promise.
final class AnswerCollector: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    let promise: EventLoopPromise<Answer>
    var answer: WebhookHTTPClient.Answer?
    /// The wait for a non-2xx answer's body; cancelled when the channel goes.
    var grace: Scheduled<Void>?
    typealias Answer = WebhookHTTPClient.Answer

    init(promise: EventLoopPromise<Answer>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            // 1xx (100 Continue) is not the answer.
            guard head.status.code >= 200 else { return }
            let answer = Answer(
                status: Int(head.status.code),
                retryAfter: head.headers.first(name: "Retry-After"),
                location: head.headers.first(name: "Location"),
                bodyPrefix: ""
            )
            self.answer = answer
            // A 2xx is all the verdict needs: a receiver that stalls in its body after it took the delivery
            // must not get it again. Another status waits a second for the body's start (for `webhooks show`),
            // then stands as it is (a 410 or a Retry-After must not turn into a timeout).
            if (200..<300).contains(answer.status) {
                self.promise.succeed(answer)
                context.close(promise: nil)
            } else {
                self.grace = context.eventLoop.assumeIsolated().scheduleTask(in: .seconds(1)) { [self] in
                    if let answer = self.answer { self.promise.succeed(answer) }
                    context.close(promise: nil)
                }
            }
        case .body(var buffer):
            guard var answer = self.answer, answer.bodyPrefix.utf8.count < 512 else { return }
            let bytes = buffer.readBytes(length: min(buffer.readableBytes, 512 - answer.bodyPrefix.utf8.count)) ?? []
            answer.bodyPrefix += String(decoding: bytes.map { (0x20..<0x7F).contains($0) ? $0 : 0x20 }, as: UTF8.self)
            self.answer = answer
        case .end:
            if let answer = self.answer {
                self.promise.succeed(answer)
                context.close(promise: nil)
            }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.grace?.cancel()
        // The head arrived but the body was cut: the status stands.
        if let answer = self.answer {
            self.promise.succeed(answer)
        } else {
            self.promise.fail(
                WebhookHTTPClient.Failure(kind: .closed, description: "the connection closed before an answer")
            )
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if self.answer == nil { self.promise.fail(error) }
        context.close(promise: nil)
    }
}

/// Lookups under way, shared by the POSTs to one host.
final class LookupTable: Sendable {
    let futures = Mutex<[String: EventLoopFuture<[SocketAddress]>]>([:])
}
