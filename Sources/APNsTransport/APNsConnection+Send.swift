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
                throw TransportError(
                    code: .shutdown,
                    mayHaveBeenProcessed: false,
                    message: "withdrawn before it was sent"
                )
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
            throw TransportError(code: .shutdown, mayHaveBeenProcessed: false, message: "withdrawn before it was sent")
        }
        if self.observer.isDraining {
            self.limiter.release()
            self.closeIfRetiredAndIdle()
            throw TransportError(
                code: .goAway,
                mayHaveBeenProcessed: false,
                message: "the connection is going away; not sent on it"
            )
        }
        let started = ContinuousClock.now
        self.touch(started)
        defer {
            self.touch(.now)
            self.limiter.release()
            self.closeIfRetiredAndIdle()
        }
        let stream: Stream
        do {
            stream = try await self.multiplexer.openStream { channel in
                channel.eventLoop.makeCompletedFuture { try Stream(wrappingChannelSynchronously: channel) }
            }
        } catch {
            throw TransportError(
                code: .connectionReset,
                mayHaveBeenProcessed: false,
                message: "could not open an HTTP/2 stream: \(error)"
            )
        }
        var requestHeaders = HPACKHeaders()
        requestHeaders.reserveCapacity(headers.count + 6)
        requestHeaders.add(name: ":method", value: method)
        requestHeaders.add(name: ":scheme", value: "https")
        requestHeaders.add(name: ":path", value: path)
        requestHeaders.add(name: ":authority", value: self.authority)
        if let authorization {
            requestHeaders.add(name: "authorization", value: "bearer " + authorization, indexing: .neverIndexed)
        }
        for header in headers { requestHeaders.add(name: header.name, value: header.value) }
        if !body.isEmpty { requestHeaders.add(name: "content-length", value: String(body.count)) }
        let finalHeaders = requestHeaders

        // The deadline is a timer on the stream's event loop that resets the stream (RST_STREAM); the
        // exchange then fails and is reported as a timeout. No extra task per request.
        let timedOut = NIOLockedValueBox(false)
        let timer = stream.channel.eventLoop.scheduleTask(in: .nanoseconds(deadline.nanoseconds)) {
            timedOut.withLockedValue { $0 = true }
            stream.channel.close(promise: nil)
        }
        defer { timer.cancel() }
        do {
            return try await Self.exchange(stream: stream, headers: finalHeaders, body: body, started: started)
        } catch {
            if timedOut.withLockedValue({ $0 }) {
                throw TransportError(
                    code: .timeout,
                    mayHaveBeenProcessed: true,
                    message: "no response within \(deadline)"
                )
            }
            stream.channel.close(promise: nil)
            if let transport = error as? TransportError { throw transport }
            throw await self.classify(error, stream: stream)
        }
    }

    private static func exchange(
        stream: Stream,
        headers: HPACKHeaders,
        body: [UInt8],
        started: ContinuousClock.Instant
    ) async throws -> APNsResponse {
        try await stream.executeThenClose { inbound, outbound in
            // HEADERS and DATA in one write: one flush, so they go out in one TLS record and one syscall.
            if body.isEmpty {
                try await outbound.write(.headers(.init(headers: headers, endStream: true)))
            } else {
                try await outbound.write(contentsOf: [
                    .headers(.init(headers: headers, endStream: false)),
                    .data(.init(data: .byteBuffer(ByteBuffer(bytes: body)), endStream: true)),
                ])
            }
            var status: Int?
            var responseHeaders = HPACKHeaders()
            var responseBody: [UInt8] = []
            var ended = false
            loop: for try await frame in inbound {
                switch frame {
                case .headers(let h):
                    if status == nil, let code = h.headers.first(name: ":status").flatMap({ Int($0) }) {
                        status = code
                        responseHeaders = h.headers
                    }
                    if h.endStream {
                        ended = true
                        break loop
                    }
                case .data(let d):
                    if case .byteBuffer(let buffer) = d.data { responseBody += buffer.readableBytesView }
                    if d.endStream {
                        ended = true
                        break loop
                    }
                case .rstStream(let code):
                    throw TransportError(
                        code: .streamReset,
                        mayHaveBeenProcessed: code != .refusedStream,
                        message: "APNs reset the stream (\(code))"
                    )
                default:
                    continue
                }
            }
            guard let status, ended else { throw StreamEndedEarly() }
            let (reason, timestamp) = status == 200 ? (nil, nil) : APNsResponse.parseErrorBody(responseBody)
            return APNsResponse(
                status: status,
                reason: reason,
                apnsID: responseHeaders.first(name: "apns-id").flatMap(UUID.init(uuidString:)),
                apnsUniqueID: responseHeaders.first(name: "apns-unique-id"),
                requestID: responseHeaders.first(name: "apns-request-id"),
                timestampMs: timestamp,
                retryAfter: responseHeaders.first(name: "retry-after"),
                channelID: responseHeaders.first(name: "apns-channel-id"),
                body: responseBody,
                latency: ContinuousClock.now - started
            )
        }
    }

    /// Turns a stream or connection failure into a ``TransportError``: streams above a GOAWAY's last
    /// stream id were not processed and may be resent at once; anything else is an unknown outcome.
    private func classify(_ error: any Error, stream: Stream) async -> TransportError {
        if let last = self.observer.goAwayLastStreamID {
            let streamID = try? await stream.channel.getOption(HTTP2StreamChannelOptions.streamID).get()
            let notProcessed = streamID.map { $0 > last } ?? true
            return TransportError(
                code: .goAway,
                mayHaveBeenProcessed: !notProcessed,
                message: "APNs closed the connection (GOAWAY, last stream \(last))"
            )
        }
        if error is StreamEndedEarly {
            return TransportError(
                code: .connectionReset,
                mayHaveBeenProcessed: true,
                message: "the stream closed before a response"
            )
        }
        if let streamError = error as? NIOHTTP2Errors.StreamClosed {
            return TransportError(
                code: .streamReset,
                mayHaveBeenProcessed: streamError.errorCode != .refusedStream,
                message: "the stream closed: \(streamError.errorCode)"
            )
        }
        return TransportError(
            code: .connectionReset,
            mayHaveBeenProcessed: true,
            message: "the connection failed mid-request: \(error)"
        )
    }
}

/// The stream's inbound side ended before a complete response; `classify` decides what that means.
struct StreamEndedEarly: Error {}
