import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2
import PushCore
import Synchronization

extension HTTP2Connection {
    /// Sends one request and returns the peer's answer, or throws ``TransportError``.
    ///
    /// - Parameters:
    ///   - method, path, headers, body: the request; `headers` exclude pseudo-headers and `authorization`.
    ///   - authorization: the `authorization` header's value (`bearer <token>`), if any.
    ///   - deadline: how long from now the whole exchange may take; past it the stream is reset.
    func send(
        method: String,
        path: String,
        headers: [(name: String, value: String)],
        body: [UInt8],
        authorization: String?,
        deadline: Duration,
        mayWrite: (@Sendable () -> Bool)? = nil
    ) async throws -> HTTP2Answer {
        guard await self.limiter.acquire() else {
            if Task.isCancelled {
                throw TransportError.withdrawn
            }
            throw TransportError(
                code: .connectionReset,
                mayHaveBeenProcessed: false,
                message: "the connection closed before the request was sent"
            )
        }
        // A stream was granted; the request is written only if the caller still wants it sent and the
        // connection has not been told to go away meanwhile.
        if Task.isCancelled || !(mayWrite?() ?? true) {
            self.limiter.release()
            self.closeIfRetiredAndIdle()
            throw TransportError.withdrawn
        }
        if self.observer.isDraining {
            self.limiter.release()
            self.closeIfRetiredAndIdle()
            throw TransportError.notSentGoingAway
        }
        let requestHeaders = self.requestHeaders(
            method: method,
            path: path,
            headers: headers,
            bodyCount: body.count,
            authorization: authorization
        )
        // A batch of one: the same path as every batch. The connection's ``FrameExchange`` opens the stream,
        // keeps its deadline (RST_STREAM past it: an unknown outcome), says of every failure whether the peer
        // may have processed the request, and gives the stream slot back. A cancelled caller resets the stream
        // (an unknown outcome) or withdraws the request if it has not reached the event loop.
        let request = LoneRequest()
        let exchange = self.exchange
        guard
            let result = await request.answer(submitting: {
                exchange.submit([(0, requestHeaders, body)], to: request, timeout: deadline)
            })
        else { throw TransportError.withdrawn }
        return try result.get()
    }

    /// A request's HTTP/2 header block.
    func requestHeaders(
        method: String,
        path: String,
        headers: [(name: String, value: String)],
        bodyCount: Int,
        authorization: String?
    ) -> HPACKHeaders {
        var requestHeaders = HPACKHeaders()
        requestHeaders.reserveCapacity(headers.count + 6)
        requestHeaders.add(name: ":method", value: method)
        requestHeaders.add(name: ":scheme", value: "https")
        // HPACK: what repeats on a connection (method, authority, token, push type, topic, priority) goes into
        // the dynamic table and costs a byte or two after the first request; what is new on every request
        // (the path with its device token, apns-id, apns-expiration, content-length) is sent literally without
        // indexing, so it never evicts the repeated ones. The bearer token is indexed too: it is the same
        // for up to an hour, and the connection is TLS straight to the provider (a proxy only tunnels it).
        requestHeaders.add(name: ":path", value: path, indexing: .nonIndexable)
        requestHeaders.add(name: ":authority", value: self.authority)
        if let authorization {
            requestHeaders.add(name: "authorization", value: authorization)
        }
        for header in headers {
            requestHeaders.add(
                name: header.name,
                value: header.value,
                indexing: self.changesEveryRequest(header.name) ? .nonIndexable : .indexable
            )
        }
        if bodyCount > 0 {
            requestHeaders.add(name: "content-length", value: String(bodyCount), indexing: .nonIndexable)
        }
        return requestHeaders
    }

    /// The exchange gave back `count` slots of batch requests that ended.
    func batchSlotsReleased(_ count: Int) {
        self.touch(self.clock.now)
        self.limiter.release(count)
        self.closeIfRetiredAndIdle()
    }
}
