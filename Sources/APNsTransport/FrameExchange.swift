import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import Synchronization

/// Every request of one connection, on raw HTTP/2 frames: the last handler of the pipeline, after
/// `NIOHTTP2Handler` (no stream channels, no task per request), in the shape of Pushy's
/// `ApnsClientHandler`. It numbers the streams, writes each request's HEADERS and DATA, matches the
/// answers by stream id, keeps one deadline queue for the connection, gives back the connection-level
/// flow-control window, and decides for every request that ends without an answer whether APNs may have
/// processed it (streams above a GOAWAY's last-stream-id were not).
///
/// Lives on its channel's event loop; ``Handle`` is the thread-safe way in.
final class FrameExchange: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    /// The connection-level receive window HTTP/2 starts with; topped up when it falls below half.
    static let connectionWindow = 65_535

    /// Who gets a request's answer: a caller waiting on a promise (one request), or a ``RequestBatch``
    /// (many requests, answered on the event loop; their stream slots are given back here).
    enum Waiter {
        case promise(EventLoopPromise<APNsResponse>)
        case batch(RequestBatch, index: Int)
    }

    private struct Exchange {
        let waiter: Waiter
        let started: ContinuousClock.Instant
        let timeout: Duration
        var status: Int?
        var headers = HPACKHeaders()
        var body: [UInt8] = []
    }

    private var context: ChannelHandlerContext?
    private var nextStreamID: Int32 = 1
    private var exchanges: [HTTP2StreamID: Exchange] = [:]
    /// Streams in the order they were opened, with their deadlines: requests on one connection share a
    /// timeout (APNsClient passes its one `requestTimeout`), so this is also deadline order; one timer
    /// serves the queue's head. A shorter timeout behind a longer one would fire late.
    /// `extended`: the deadline was moved once already because this process was stalled when it fell due.
    private var deadlines = CircularBuffer<(streamID: HTTP2StreamID, at: NIODeadline, extended: Bool)>()
    private var timer: Scheduled<Void>?
    private var goAwayLast: HTTP2StreamID?
    private var closed = false
    /// Stream slots of batch requests that ended, not yet given back: handed back once per read cycle, so a
    /// batch waiting for slots gets them together instead of one wake-up per answer.
    private var releasedSlots = 0
    private var reading = false
    /// Gives stream slots back to the connection's limiter (set once the connection exists).
    var slotsReleased: ((Int) -> Void)?

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.failAll()
        self.flushReleasedSlots()
        self.slotsReleased = nil
        self.context = nil
    }

    /// Opens a stream and writes the request without flushing (``flushWrites()`` follows a batch); `promise`
    /// gets the answer or a ``TransportError``.
    func start(
        headers: HPACKHeaders,
        body: [UInt8],
        started: ContinuousClock.Instant,
        timeout: Duration,
        waiter: Waiter
    ) {
        guard let context, !self.closed, context.channel.isActive else {
            self.fail(
                waiter,
                TransportError(
                    code: .connectionReset,
                    mayHaveBeenProcessed: false,
                    message: "the connection closed before the request was sent"
                )
            )
            return
        }
        // Stream ids run out after 2^30 requests on one connection (days at full speed): refuse new ones, and
        // close the connection once its last answer is in; the pool then opens another.
        if self.goAwayLast != nil || self.nextStreamID > Int32.max - 2 {
            if self.exchanges.isEmpty && self.nextStreamID > Int32.max - 2 { context.close(promise: nil) }
            self.fail(
                waiter,
                TransportError.notSentGoingAway
            )
            return
        }
        let streamID = HTTP2StreamID(self.nextStreamID)
        self.nextStreamID += 2
        self.exchanges[streamID] = Exchange(waiter: waiter, started: started, timeout: timeout)
        self.deadlines.append((streamID, .now() + .nanoseconds(timeout.nanoseconds), false))
        if self.timer == nil { self.scheduleTimer(context: context) }
        let written = context.eventLoop.makePromise(of: Void.self)
        // A failed write is "not processed" only where that is certain: a stream NIO refused to open after
        // a GOAWAY, or one above the GOAWAY's last-stream-id. Otherwise TLS may already have sent part of the
        // batch this request was flushed with (one ciphertext buffer, one promise): an unknown outcome.
        written.futureResult.assumeIsolated().whenFailure { error in
            let error: TransportError =
                if let last = self.goAwayLast, streamID > last {
                    Self.goneAway(last)
                } else if error is NIOHTTP2Errors.CreatedStreamAfterGoaway {
                    TransportError.notSentGoingAway
                } else {
                    TransportError(
                        code: .connectionReset,
                        mayHaveBeenProcessed: true,
                        message: "the connection failed while the request was being written: \(error)"
                    )
                }
            self.finish(streamID, with: .failure(error))
            self.flushUnlessReading()
        }
        if body.isEmpty {
            context.write(
                self.wrapOutboundOut(
                    HTTP2Frame(streamID: streamID, payload: .headers(.init(headers: headers, endStream: true)))
                ),
                promise: written
            )
        } else {
            context.write(
                self.wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(.init(headers: headers)))),
                promise: nil
            )
            context.write(
                self.wrapOutboundOut(
                    HTTP2Frame(
                        streamID: streamID,
                        payload: .data(
                            .init(data: .byteBuffer(context.channel.allocator.buffer(bytes: body)), endStream: true)
                        )
                    )
                ),
                promise: written
            )
        }
    }

    /// Flushes what ``start(headers:body:started:timeout:waiter:)`` wrote.
    func flushWrites() {
        self.context?.flush()
        self.flushReleasedSlots()
    }

    /// A request that never got a stream: its waiter learns why (a batch request's slot goes back).
    private func fail(_ waiter: Waiter, _ error: TransportError) {
        switch waiter {
        case .promise(let promise):
            promise.fail(error)
        case .batch(let batch, let index):
            self.releasedSlots += 1
            batch.deliver(index, .failure(error))
            self.flushUnlessReading()
        }
    }

    /// Outside a read cycle, gives slots back now; within one, channelReadComplete does.
    private func flushUnlessReading() {
        if !self.reading { self.flushReleasedSlots() }
    }

    /// Gives the slots of ended batch requests back, all at once.
    private func flushReleasedSlots() {
        guard self.releasedSlots > 0 else { return }
        let count = self.releasedSlots
        self.releasedSlots = 0
        self.slotsReleased?(count)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.reading = false
        self.flushReleasedSlots()
        context.fireChannelReadComplete()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.reading = true
        let frame = self.unwrapInboundIn(data)
        switch frame.payload {
        case .headers(let headers):
            guard var exchange = self.exchanges[frame.streamID] else { return }
            if exchange.status == nil, let status = headers.headers.first(name: ":status").flatMap({ Int($0) }),
                status >= 200
            {
                exchange.status = status
                exchange.headers = headers.headers
            }
            self.exchanges[frame.streamID] = exchange
            if headers.endStream { self.complete(frame.streamID) }
        case .data(let data):
            guard var exchange = self.exchanges[frame.streamID] else { return }
            if case .byteBuffer(let buffer) = data.data { exchange.body += buffer.readableBytesView }
            self.exchanges[frame.streamID] = exchange
            if data.endStream { self.complete(frame.streamID) }
        case .rstStream(let code):
            // A 200 already read is the answer: APNs processed the push (a 200 carries no body to wait for).
            if self.completeIfAnsweredOK(frame.streamID) { return }
            self.finish(
                frame.streamID,
                with: .failure(
                    TransportError(
                        code: .streamReset,
                        mayHaveBeenProcessed: code != .refusedStream,
                        message: "APNs reset the stream (\(code))"
                    )
                )
            )
        case .goAway(let last, _, _):
            // Streams above the last one APNs processed were not processed: they fail now, to be resent.
            self.goAwayLast = last
            for streamID in self.exchanges.keys where streamID > last {
                self.finish(streamID, with: .failure(Self.goneAway(last)))
            }
        default:
            break
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let closed = event as? StreamClosedEvent, self.exchanges[closed.streamID] != nil,
            !self.completeIfAnsweredOK(closed.streamID)
        {
            let error: TransportError
            if let last = self.goAwayLast, closed.streamID > last {
                error = Self.goneAway(last)
            } else if let reason = closed.reason {
                error = TransportError(
                    code: .streamReset,
                    mayHaveBeenProcessed: reason != .refusedStream,
                    message: "the stream closed: \(reason)"
                )
            } else {
                error = Self.unknownOutcome("the stream closed before a response")
            }
            self.finish(closed.streamID, with: .failure(error))
        } else if let window = event as? NIOHTTP2WindowUpdatedEvent, window.streamID == .rootStream,
            let inbound = window.inboundWindowSize, inbound < Self.connectionWindow / 2
        {
            // Without stream channels nobody else gives the connection's receive window back.
            context.writeAndFlush(
                self.wrapOutboundOut(
                    HTTP2Frame(
                        streamID: .rootStream,
                        payload: .windowUpdate(windowSizeIncrement: Self.connectionWindow - inbound)
                    )
                ),
                promise: nil
            )
        }
        self.flushUnlessReading()
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closed = true
        self.timer?.cancel()
        self.timer = nil
        self.failAll()
        self.reading = false
        self.flushReleasedSlots()
        context.fireChannelInactive()
    }

    private static func goneAway(_ last: HTTP2StreamID) -> TransportError {
        TransportError(
            code: .goAway,
            mayHaveBeenProcessed: false,
            message: "APNs closed the connection (GOAWAY, last stream \(last))"
        )
    }

    /// The caller gave up on the request whose answer is `future`: reset its stream, report an unknown outcome.
    func cancel(_ future: EventLoopFuture<APNsResponse>) {
        guard
            let streamID = self.exchanges.first(where: {
                if case .promise(let promise) = $0.value.waiter { promise.futureResult === future } else { false }
            })?.key
        else {
            return
        }
        self.finish(
            streamID,
            with: .failure(
                Self.unknownOutcome("the request was cancelled while in flight")
            )
        )
        self.context?.writeAndFlush(
            self.wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel))),
            promise: nil
        )
    }

    /// Completes a stream whose `:status 200` was read, though its END_STREAM never came (a reset, a close):
    /// the push was delivered, and reporting an unknown outcome would send it again.
    private func completeIfAnsweredOK(_ streamID: HTTP2StreamID) -> Bool {
        guard self.exchanges[streamID]?.status == 200 else { return false }
        self.complete(streamID)
        return true
    }

    private func complete(_ streamID: HTTP2StreamID) {
        guard let exchange = self.exchanges[streamID] else { return }
        guard let status = exchange.status else {
            self.finish(
                streamID,
                with: .failure(
                    Self.unknownOutcome("the stream ended without a status")
                )
            )
            return
        }
        let (reason, timestamp) = status == 200 ? (nil, nil) : APNsResponse.parseErrorBody(exchange.body)
        let headers = exchange.headers
        self.finish(
            streamID,
            with: .success(
                APNsResponse(
                    status: status,
                    reason: reason,
                    apnsID: headers.first(name: "apns-id").flatMap(UUID.init(uuidString:)),
                    apnsUniqueID: headers.first(name: "apns-unique-id"),
                    requestID: headers.first(name: "apns-request-id"),
                    timestampMs: timestamp,
                    retryAfter: headers.first(name: "retry-after"),
                    channelID: headers.first(name: "apns-channel-id"),
                    body: exchange.body,
                    latency: ContinuousClock.now - exchange.started,
                    serverDate: headers.first(name: "date")
                )
            )
        )
    }

    /// The caller of `batch` gave up on it: every request of it still in flight here is reset and reported
    /// as an unknown outcome.
    func cancel(_ batch: RequestBatch) {
        let streamIDs = self.exchanges.compactMap { entry -> HTTP2StreamID? in
            if case .batch(let owner, _) = entry.value.waiter, owner === batch { entry.key } else { nil }
        }
        for streamID in streamIDs.sorted() {
            self.finish(streamID, with: .failure(Self.unknownOutcome("the request was cancelled while in flight")))
            self.context?.write(
                self.wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel))),
                promise: nil
            )
        }
        if !streamIDs.isEmpty { self.context?.flush() }
        self.flushUnlessReading()
    }

    private func finish(_ streamID: HTTP2StreamID, with result: Result<APNsResponse, TransportError>) {
        guard let exchange = self.exchanges.removeValue(forKey: streamID) else { return }
        if self.exchanges.isEmpty && self.nextStreamID > Int32.max - 2 { self.context?.close(promise: nil) }
        switch exchange.waiter {
        case .promise(let promise):
            switch result {
            case .success(let response): promise.succeed(response)
            case .failure(let error): promise.fail(error)
            }
        case .batch(let batch, let index):
            self.releasedSlots += 1
            batch.deliver(index, result)
        }
    }

    /// The connection is gone: streams above a GOAWAY's last-stream-id were not processed, the rest may
    /// have been.
    private func failAll() {
        for streamID in self.exchanges.keys {
            if self.completeIfAnsweredOK(streamID) { continue }
            if let last = self.goAwayLast, streamID > last {
                self.finish(streamID, with: .failure(Self.goneAway(last)))
            } else {
                self.finish(streamID, with: .failure(Self.unknownOutcome("the connection closed mid-request")))
            }
        }
    }

    private static func unknownOutcome(_ message: String) -> TransportError {
        TransportError(code: .connectionReset, mayHaveBeenProcessed: true, message: message)
    }

    /// Expires the requests past their deadline (RST_STREAM CANCEL: an unknown outcome), then waits for
    /// the next one.
    private func scheduleTimer(context: ChannelHandlerContext) {
        while let head = self.deadlines.first, self.exchanges[head.streamID] == nil {
            self.deadlines.removeFirst()
        }
        guard let head = self.deadlines.first else {
            self.timer = nil
            return
        }
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timer = context.eventLoop.scheduleTask(deadline: head.at) {
            let (exchange, context) = loopBound.value
            exchange.expire(context: context)
        }
    }

    /// How late a deadline timer may fire before this process counts as having been stalled.
    static let stallThreshold = TimeAmount.seconds(1)
    /// How long overdue streams may still be answered after a stall.
    static let stallGrace = TimeAmount.seconds(2)

    private func expire(context: ChannelHandlerContext) {
        let now = NIODeadline.now()
        // The timer fired late: this process was stalled (SIGSTOP, a VM pause, a throttled container), and
        // the answers APNs sent meanwhile may be waiting unread in the socket. A deadline that passed while
        // nothing here could run is no evidence against the request: each overdue stream gets one grace
        // period in which its answer can be read. Timing them out now would send delivered pushes again.
        // A deadline falling due just after such a stall (the process-wide ``StallDetector`` saw it) gets the
        // same grace: after a long freeze the event loop has a backlog to read before it reaches this socket.
        let stall = StallDetector.shared.lastStall
        let stalledRecently = stall.map { now - $0 < Self.stallGrace } ?? false
        if let head = self.deadlines.first, !head.extended, now - head.at > Self.stallThreshold || stalledRecently {
            let graceFrom = max(now, stall ?? now)
            for index in self.deadlines.indices where self.deadlines[index].at <= now && !self.deadlines[index].extended
            {
                self.deadlines[index].at = graceFrom + Self.stallGrace
                self.deadlines[index].extended = true
            }
            self.scheduleTimer(context: context)
            return
        }
        var reset = false
        while let head = self.deadlines.first, head.at <= now || self.exchanges[head.streamID] == nil {
            self.deadlines.removeFirst()
            guard let exchange = self.exchanges[head.streamID] else { continue }
            // Finished first: the reset closes the stream, and its close event must find nothing to fail.
            self.finish(
                head.streamID,
                with: .failure(
                    TransportError(
                        code: .timeout,
                        mayHaveBeenProcessed: true,
                        message: "no response within \(exchange.timeout)"
                    )
                )
            )
            context.write(
                self.wrapOutboundOut(HTTP2Frame(streamID: head.streamID, payload: .rstStream(.cancel))),
                promise: nil
            )
            reset = true
        }
        if reset { context.flush() }
        self.flushUnlessReading()
        self.scheduleTimer(context: context)
    }
}

extension FrameExchange {
    /// The way into a ``FrameExchange`` from any thread.
    struct Handle: Sendable {
        let exchange: NIOLoopBound<FrameExchange>
        let eventLoop: any EventLoop
        private let inbox = Inbox()

        init(_ exchange: FrameExchange, eventLoop: any EventLoop) {
            self.exchange = NIOLoopBound(exchange, eventLoop: eventLoop)
            self.eventLoop = eventLoop
        }

        /// Sends one request and waits for its answer; throws ``TransportError``.
        func send(
            headers: HPACKHeaders,
            body: [UInt8],
            started: ContinuousClock.Instant,
            timeout: Duration
        ) async throws -> APNsResponse {
            let promise = self.eventLoop.makePromise(of: APNsResponse.self)
            let exchange = self.exchange
            // Requests from many tasks reach the event loop together: one hop (and one flush) per batch, not
            // one per request. Whoever finds the inbox empty schedules the hop.
            let submission = Submission(
                headers: headers,
                body: body,
                started: started,
                timeout: timeout,
                promise: promise
            )
            if self.inbox.add(submission) {
                let inbox = self.inbox
                self.eventLoop.execute {
                    for submission in inbox.takeAll() {
                        // Cancelled before it reached the loop: withdrawn, never written.
                        if submission.cancelled.load(ordering: .acquiring) {
                            submission.promise.fail(
                                TransportError.withdrawn
                            )
                            continue
                        }
                        exchange.value.start(
                            headers: submission.headers,
                            body: submission.body,
                            started: submission.started,
                            timeout: submission.timeout,
                            waiter: .promise(submission.promise)
                        )
                    }
                    exchange.value.flushWrites()
                }
            }
            // A cancelled caller (a shutdown past its grace period) stops waiting at once: the stream is reset
            // and the request reported as an unknown outcome, as it may have reached APNs.
            return try await withTaskCancellationHandler {
                try await promise.futureResult.get()
            } onCancel: {
                submission.cancelled.store(true, ordering: .releasing)
                self.eventLoop.execute { exchange.value.cancel(promise.futureResult) }
            }
        }
    }
}

extension FrameExchange.Handle {
    /// Writes a batch's requests (each holding a stream slot already) in one hop to the event loop, with one
    /// flush; their answers go to `batch` as they come. A request the batch's caller gave up on before the hop
    /// is withdrawn unsent.
    func submit(
        _ requests: [(index: Int, headers: HPACKHeaders, body: [UInt8])],
        to batch: RequestBatch,
        started: ContinuousClock.Instant,
        timeout: Duration
    ) {
        let exchange = self.exchange
        self.eventLoop.execute {
            let exchange = exchange.value
            for request in requests {
                if batch.isCancelled {
                    exchange.withdraw(.batch(batch, index: request.index))
                    continue
                }
                exchange.start(
                    headers: request.headers,
                    body: request.body,
                    started: started,
                    timeout: timeout,
                    waiter: .batch(batch, index: request.index)
                )
            }
            exchange.flushWrites()
        }
    }

    /// Resets every request of `batch` still in flight on this connection (an unknown outcome each).
    func cancel(_ batch: RequestBatch) {
        let exchange = self.exchange
        self.eventLoop.execute { exchange.value.cancel(batch) }
    }
}

extension FrameExchange {
    /// A request whose caller gave up before it reached the event loop: never written.
    func withdraw(_ waiter: Waiter) {
        self.fail(
            waiter,
            TransportError.withdrawn
        )
    }

    /// One request on its way to the event loop; `cancelled` once its caller gave up.
    final class Submission: Sendable {
        let headers: HPACKHeaders
        let body: [UInt8]
        let started: ContinuousClock.Instant
        let timeout: Duration
        let promise: EventLoopPromise<APNsResponse>
        let cancelled = Atomic(false)

        init(
            headers: HPACKHeaders,
            body: [UInt8],
            started: ContinuousClock.Instant,
            timeout: Duration,
            promise: EventLoopPromise<APNsResponse>
        ) {
            self.headers = headers
            self.body = body
            self.started = started
            self.timeout = timeout
            self.promise = promise
        }
    }

    /// The requests waiting for the event loop's next hop.
    final class Inbox: Sendable {
        private let submissions = Mutex<[Submission]>([])

        /// Queues one; `true` when the queue was empty, so the caller schedules the hop.
        func add(_ submission: Submission) -> Bool {
            self.submissions.withLock { queue in
                queue.append(submission)
                return queue.count == 1
            }
        }

        /// Everything queued, in order.
        func takeAll() -> [Submission] {
            self.submissions.withLock { queue in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
        }
    }
}
