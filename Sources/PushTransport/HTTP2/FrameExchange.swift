import NIOCore
import NIOHPACK
import NIOHTTP2

/// Every request of one connection, on raw HTTP/2 frames: the last handler of the pipeline, after
/// `NIOHTTP2Handler` (no stream channels, no task per request), in the shape of Pushy's
/// `ApnsClientHandler`. It turns frames, write failures, timer firings and cancellations into events of an
/// ``ExchangeStateMachine`` and carries out what the machine decides: writes a request's HEADERS and
/// DATA, resets streams, arms the one deadline timer, hands each ended request to its batch (``AnswerSink``), gives
/// back the connection-level flow-control window, and closes a connection whose stream ids are spent.
///
/// Lives on its channel's event loop; ``Handle`` is the thread-safe way in.
final class FrameExchange: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    /// The connection-level receive window HTTP/2 starts with; topped up when it falls below half.
    static let connectionWindow = 65_535

    /// Who gets a request's answer: a batch (or a lone request's caller), at an index.
    struct Slot {
        let batch: any AnswerSink
        let index: Int
    }

    private var context: ChannelHandlerContext?
    private var machine: ExchangeStateMachine<Slot>
    private var timer: Scheduled<Void>?
    /// Stream slots of requests that ended, not yet given back: handed back once per read cycle, so a
    /// batch waiting for slots gets them together instead of one wake-up per answer.
    private var releasedSlots = 0
    private var reading = false
    /// Gives stream slots back to the connection's limiter (set once the connection exists).
    var slotsReleased: ((Int) -> Void)?
    /// When this process last came out of a stall (the process-wide ``StallDetector``; tests set their own).
    let lastStall: () -> NIODeadline?

    init(
        peer: String,
        firstStreamID: Int32 = 1,
        lastStall: @escaping () -> NIODeadline? = { StallDetector.shared.lastStall }
    ) {
        self.machine = ExchangeStateMachine(peer: peer, firstStreamID: firstStreamID)
        self.lastStall = lastStall
    }

    /// Requests in flight (for tests).
    var inFlight: Int { self.machine.inFlight }

    private var now: NIODeadline { self.context?.eventLoop.now ?? .now() }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.deliver(self.machine.connectionClosed(now: self.now))
        self.flushReleasedSlots()
        self.slotsReleased = nil
        self.context = nil
    }

    /// Opens a stream and writes the request without flushing (``flushWrites()`` follows a batch).
    func start(headers: HPACKHeaders, body: [UInt8], timeout: TimeAmount, slot: Slot) {
        guard let context, context.channel.isActive else {
            self.refuse(
                slot,
                TransportError(
                    code: .connectionReset,
                    mayHaveBeenProcessed: false,
                    message: "the connection closed before the request was sent"
                )
            )
            return
        }
        let streamID: HTTP2StreamID
        switch self.machine.open(slot, now: self.now, timeout: timeout) {
        case .refuse(let error, let closeConnection):
            if closeConnection { context.close(promise: nil) }
            self.refuse(slot, error)
            return
        case .write(let opened, let armTimer):
            streamID = opened
            if let armTimer { self.arm(at: armTimer, context: context) }
        }
        let written = context.eventLoop.makePromise(of: Void.self)
        written.futureResult.assumeIsolated().whenFailure { error in
            let completion = self.machine.writeFailed(
                streamID,
                refusedAfterGoAway: error is NIOHTTP2Errors.CreatedStreamAfterGoaway,
                error: "\(error)",
                now: self.now
            )
            self.deliver(completion)
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

    /// Flushes what ``start(headers:body:timeout:slot:)`` wrote.
    func flushWrites() {
        self.context?.flush()
        self.flushReleasedSlots()
    }

    /// A request that never got a stream (or was withdrawn before it reached the loop): its batch learns
    /// why, and its slot goes back.
    func refuse(_ slot: Slot, _ error: TransportError) {
        self.releasedSlots += 1
        slot.batch.deliver(slot.index, .failure(error))
        self.flushUnlessReading()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.reading = true
        let frame = self.unwrapInboundIn(data)
        switch frame.payload {
        case .headers(let headers):
            self.deliver(
                self.machine.headers(
                    frame.streamID,
                    status: headers.headers.first(name: ":status").flatMap { Int($0) },
                    headers: headers.headers,
                    endStream: headers.endStream,
                    now: self.now
                )
            )
        case .data(let data):
            let bytes: ByteBuffer? = if case .byteBuffer(let buffer) = data.data { buffer } else { nil }
            self.deliver(self.machine.data(frame.streamID, bytes, endStream: data.endStream, now: self.now))
        case .rstStream(let code):
            self.deliver(self.machine.reset(frame.streamID, code: code, now: self.now))
        case .goAway(let last, _, _):
            self.deliver(self.machine.goAway(last: last, now: self.now))
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.reading = false
        self.flushReleasedSlots()
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let closed = event as? StreamClosedEvent {
            self.deliver(self.machine.streamClosed(closed.streamID, reason: closed.reason, now: self.now))
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
        self.timer?.cancel()
        self.timer = nil
        self.deliver(self.machine.connectionClosed(now: self.now))
        self.reading = false
        self.flushReleasedSlots()
        context.fireChannelInactive()
    }

    /// The caller of `batch` gave up on it: every request of it still in flight here is reset and reported
    /// as an unknown outcome.
    func cancel(_ batch: any AnswerSink) {
        let completions = self.machine.cancel(where: { $0.batch === batch }, now: self.now)
        self.deliver(completions)
        for completion in completions {
            self.context?.write(
                self.wrapOutboundOut(HTTP2Frame(streamID: completion.streamID, payload: .rstStream(.cancel))),
                promise: nil
            )
        }
        if !completions.isEmpty { self.context?.flush() }
        self.flushUnlessReading()
    }

    // MARK: Carrying out the machine's decisions

    private func deliver(_ completion: ExchangeStateMachine<Slot>.Completion?) {
        guard let completion else { return }
        self.releasedSlots += 1
        completion.slot.batch.deliver(completion.slot.index, completion.result)
        if self.machine.isSpentAndIdle { self.context?.close(promise: nil) }
    }

    private func deliver(_ completions: [ExchangeStateMachine<Slot>.Completion]) {
        for completion in completions { self.deliver(completion) }
    }

    /// Outside a read cycle, gives slots back now; within one, channelReadComplete does.
    private func flushUnlessReading() {
        if !self.reading { self.flushReleasedSlots() }
    }

    /// Gives the slots of ended requests back, all at once.
    private func flushReleasedSlots() {
        guard self.releasedSlots > 0 else { return }
        let count = self.releasedSlots
        self.releasedSlots = 0
        self.slotsReleased?(count)
    }

    private func arm(at deadline: NIODeadline, context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timer?.cancel()
        self.timer = context.eventLoop.scheduleTask(deadline: deadline) {
            let (exchange, context) = loopBound.value
            exchange.deadlineFired(context: context)
        }
    }

    /// Expires the requests past their deadline (RST_STREAM CANCEL: an unknown outcome), then waits for
    /// the next one.
    private func deadlineFired(context: ChannelHandlerContext) {
        self.timer = nil
        let expiry = self.machine.deadlineFired(now: self.now, lastStall: self.lastStall())
        // Ended first: the reset closes the stream, and its close event must find nothing to fail.
        self.deliver(expiry.completions)
        for streamID in expiry.resets {
            context.write(
                self.wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel))),
                promise: nil
            )
        }
        if !expiry.resets.isEmpty { context.flush() }
        self.flushUnlessReading()
        if let next = expiry.armTimer { self.arm(at: next, context: context) }
    }
}

extension FrameExchange {
    /// The way into a ``FrameExchange`` from any thread.
    struct Handle: Sendable {
        let exchange: NIOLoopBound<FrameExchange>
        let eventLoop: any EventLoop
        /// Which exchange it is, from any thread.
        let id: ObjectIdentifier

        init(_ exchange: FrameExchange, eventLoop: any EventLoop) {
            self.exchange = NIOLoopBound(exchange, eventLoop: eventLoop)
            self.eventLoop = eventLoop
            self.id = ObjectIdentifier(exchange)
        }

        /// Writes a batch's requests (each holding a stream slot of the connection's limiter already) in
        /// one hop to the event loop, with one flush; their answers go to `batch` as they come, and the slots
        /// back to the limiter once per read cycle. A request the batch's caller gave up on before the hop is
        /// withdrawn unsent.
        func submit(
            _ requests: [(index: Int, headers: HPACKHeaders, body: [UInt8])],
            to batch: any AnswerSink,
            timeout: Duration
        ) {
            // The batch waits for these answers, and a cancellation resets them here.
            batch.expect(requests.count, on: self)
            let exchange = self.exchange
            let timeout = TimeAmount.nanoseconds(timeout.nanoseconds)
            self.eventLoop.execute {
                let exchange = exchange.value
                for request in requests {
                    let slot = Slot(batch: batch, index: request.index)
                    if batch.isCancelled {
                        exchange.refuse(slot, .withdrawn)
                        continue
                    }
                    exchange.start(headers: request.headers, body: request.body, timeout: timeout, slot: slot)
                }
                exchange.flushWrites()
            }
        }

        /// Resets every request of `batch` still in flight on this connection (an unknown outcome each).
        func cancel(_ batch: any AnswerSink) {
            let exchange = self.exchange
            self.eventLoop.execute { exchange.value.cancel(batch) }
        }
    }
}
