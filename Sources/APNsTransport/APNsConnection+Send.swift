import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2
import PushCore

extension APNsConnection {
    /// Sends one request and returns APNs' answer, or throws ``TransportError``.
    ///
    /// - Parameters:
    ///   - method, path, headers, body: the request; `headers` exclude pseudo-headers and `authorization`.
    ///   - authorization: the provider token, sent as `bearer <jwt>`, if any.
    ///   - deadline: how long from now the whole exchange may take; past it the stream is reset.
    func send(
        method: String,
        path: String,
        headers: [(name: String, value: String)],
        body: [UInt8],
        authorization: String?,
        deadline: Duration,
        mayWrite: (@Sendable () -> Bool)? = nil
    ) async throws -> APNsResponse {
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
        let started = ContinuousClock.now
        self.touch(started)
        defer {
            self.touch(.now)
            self.limiter.release()
            self.closeIfRetiredAndIdle()
        }
        let requestHeaders = self.requestHeaders(
            method: method,
            path: path,
            headers: headers,
            bodyCount: body.count,
            authorization: authorization
        )
        // The connection's ``FrameExchange`` opens the stream, keeps its deadline (RST_STREAM past it: an
        // unknown outcome) and says of every failure whether APNs may have processed the request.
        return try await self.exchange.send(headers: requestHeaders, body: body, started: started, timeout: deadline)
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
        // indexing, so it never evicts the repeated ones. The provider token is indexed too: it is the same
        // for up to an hour, and the connection is TLS straight to APNs (a proxy only tunnels it).
        requestHeaders.add(name: ":path", value: path, indexing: .nonIndexable)
        requestHeaders.add(name: ":authority", value: self.authority)
        if let authorization {
            requestHeaders.add(name: "authorization", value: "bearer " + authorization)
        }
        for header in headers {
            requestHeaders.add(
                name: header.name,
                value: header.value,
                indexing: Self.changesEveryRequest(header.name) ? .nonIndexable : .indexable
            )
        }
        if bodyCount > 0 {
            requestHeaders.add(name: "content-length", value: String(bodyCount), indexing: .nonIndexable)
        }
        return requestHeaders
    }

    /// Writes requests that hold stream slots (``StreamLimiter/acquire(upTo:)``) in one hop; answers go to
    /// `batch`, and the slots come back through the exchange once per read cycle.
    func submit(
        _ requests: [(index: Int, headers: HPACKHeaders, body: [UInt8])],
        to batch: RequestBatch,
        deadline: Duration
    ) {
        let started = ContinuousClock.now
        self.touch(started)
        batch.expect(requests.count, on: self)
        self.exchange.submit(requests, to: batch, started: started, timeout: deadline)
    }

    /// The exchange gave back `count` slots of batch requests that ended.
    func batchSlotsReleased(_ count: Int) {
        self.touch(.now)
        self.limiter.release(count)
        self.closeIfRetiredAndIdle()
    }

    /// Whether a request header's value is new on (almost) every request: never put in the HPACK dynamic
    /// table. (Plain comparisons: a set lookup hashes the name on every header of every request.)
    static func changesEveryRequest(_ name: String) -> Bool {
        name == "apns-id" || name == "apns-expiration" || name == "apns-request-id"
    }
}
