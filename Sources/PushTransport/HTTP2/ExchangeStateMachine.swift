import NIOCore
import NIOHPACK
import NIOHTTP2

/// The requests of one HTTP/2 connection as a pure state machine: events in (a stream opened, HEADERS,
/// DATA, RST_STREAM, GOAWAY, a write failed, a deadline, a cancellation, the connection gone), and out
/// the requests that ended, each with its answer or a ``TransportError`` that already says whether the
/// peer may have processed it. No I/O and no clock of its own: the time comes with each event, so a test
/// drives it event by event. ``FrameExchange`` is the NIO handler that feeds it frames and carries out
/// what it returns (write a RST_STREAM, arm the timer, close the connection), as nio-http2 keeps its
/// `HTTP2ConnectionStateMachine` apart from its channel handler.
///
/// The rules it keeps, each once:
/// - a `:status 200` already read is the answer, even when the stream then resets, times out, is cancelled
///   or the connection drops (the push was delivered; reporting an unknown outcome would send it again);
/// - streams above a GOAWAY's last-stream-id were not processed; so were streams refused before they
///   were written (after a GOAWAY, or with stream ids used up) and `REFUSED_STREAM` resets;
/// - everything else that ends without an answer is an unknown outcome (`mayHaveBeenProcessed`);
/// - deadlines run in order; a deadline never ends a stream at the instant it falls due: the stream gets
///   a last look (its answer may be unread in the socket while the event loop runs a backlog of tasks),
///   and a timer that fires late, or after a process-wide stall, gives it one grace period.
struct ExchangeStateMachine<Waiter> {
    /// One request that ended.
    struct Completion {
        var streamID: HTTP2StreamID
        var slot: Waiter
        var result: Result<HTTP2Answer, TransportError>
    }

    /// What ``open(_:now:timeout:)`` decided.
    enum Opening {
        /// Write the request on this stream; arm the deadline timer for `armTimer` if set.
        case write(HTTP2StreamID, armTimer: NIODeadline?)
        /// Not written: the waiter fails with `error` (nothing was sent); `closeConnection` when the
        /// connection's stream ids are used up and nothing is left in flight.
        case refuse(TransportError, closeConnection: Bool)
    }

    /// What a deadline timer's firing decided.
    struct Expiry {
        /// Requests past their deadline: unknown outcomes.
        var completions: [Completion] = []
        /// Streams to reset (`CANCEL`): the expired ones.
        var resets: [HTTP2StreamID] = []
        /// Arm the timer again for this instant (`nil`: nothing left to time).
        var armTimer: NIODeadline?
    }

    private struct Exchange {
        var slot: Waiter
        var opened: NIODeadline
        var timeout: TimeAmount
        var status: Int?
        var headers = HPACKHeaders()
        var body: [UInt8] = []
    }

    /// The last stream id a client may open (odd, below 2^31).
    static var lastStreamID: Int32 { Int32.max - 2 }
    /// How late a deadline timer may fire before this process counts as having been stalled. An event loop
    /// fires its timers within milliseconds; a freeze that ends just after a deadline makes it half a second
    /// late while the stall detector's thread, racing this one out of the same freeze, may not have said so
    /// yet (a fleet seed resent 11 delivered pushes that way with a 1 s threshold). Taken for a stall when
    /// it was not, a request gets its grace period once: two seconds more.
    static var stallThreshold: TimeAmount { .milliseconds(200) }
    /// How long overdue streams may still be answered after a stall.
    static var stallGrace: TimeAmount { .seconds(2) }
    /// How long a stream whose deadline fell due on time waits before it ends as a timeout. An event loop
    /// runs its due timers in the same pass as its tasks, before it reads its sockets again: a worker
    /// thawed just before a deadline, with a backlog of tasks, fires it while the 200 the peer wrote during
    /// the freeze sits unread (a fleet seed resent 15 delivered pushes that way). The last look lets one
    /// more read pass happen, and lets the stall detector (a thread on a quarter-second tick) say whether
    /// the process was frozen, which earns the stream the full grace.
    static var lastLook: TimeAmount { .milliseconds(300) }

    private var nextStreamID: Int32
    private var exchanges: [HTTP2StreamID: Exchange] = [:]
    /// Streams in opening order with their deadlines (one timeout per connection, so deadline order too);
    /// Where a stream's deadline stands: as opened, given its last look, or extended once for a stall.
    private enum DeadlinePhase { case opened, lastLook, extended }
    private typealias Deadline = (streamID: HTTP2StreamID, at: NIODeadline, phase: DeadlinePhase)
    /// Open streams by deadline, earliest first.
    private var deadlines = CircularBuffer<Deadline>()
    private var timerArmed = false
    private(set) var goAwayLast: HTTP2StreamID?
    private(set) var closed = false

    /// Who answers, as errors name it ("APNs", "FCM").
    let peer: String

    /// - Parameters:
    ///   - peer: who answers, as errors name it.
    ///   - firstStreamID: the first stream id to open (1; tests start near the end of the range).
    init(peer: String, firstStreamID: Int32 = 1) {
        self.peer = peer
        self.nextStreamID = firstStreamID
    }

    /// Requests in flight.
    var inFlight: Int { self.exchanges.count }

    /// Whether the connection should close now: its stream ids are used up and its last answer is in.
    var isSpentAndIdle: Bool { self.exchanges.isEmpty && self.nextStreamID > Self.lastStreamID }

    // MARK: Opening

    /// A request wants a stream.
    mutating func open(_ waiter: Waiter, now: NIODeadline, timeout: TimeAmount) -> Opening {
        if self.closed {
            return .refuse(
                TransportError(
                    code: .connectionReset,
                    mayHaveBeenProcessed: false,
                    message: "the connection closed before the request was sent"
                ),
                closeConnection: false
            )
        }
        // Stream ids run out after 2^30 requests on one connection (days at full speed): refuse new ones, and
        // close the connection once its last answer is in; the pool then opens another.
        if self.goAwayLast != nil || self.nextStreamID > Self.lastStreamID {
            return .refuse(.notSentGoingAway, closeConnection: self.isSpentAndIdle)
        }
        let streamID = HTTP2StreamID(self.nextStreamID)
        self.nextStreamID += 2
        self.exchanges[streamID] = Exchange(slot: waiter, opened: now, timeout: timeout)
        let at = now + timeout
        let wasHead = self.deadlines.first?.at
        self.insert([(streamID, at, .opened)])
        // The timer is armed for the head; a shorter timeout than the rest (or a first stream) re-arms it.
        if self.timerArmed, let wasHead, wasHead <= at { return .write(streamID, armTimer: nil) }
        self.timerArmed = true
        return .write(streamID, armTimer: at)
    }

    /// The write of `streamID`'s request failed. `refusedAfterGoAway`: NIO refused to open the stream
    /// because the connection is going away (nothing was sent).
    mutating func writeFailed(
        _ streamID: HTTP2StreamID,
        refusedAfterGoAway: Bool,
        error: String,
        now: NIODeadline
    ) -> Completion? {
        // "Not processed" only where that is certain; otherwise TLS may already have sent part of the batch
        // this request was flushed with (one ciphertext buffer, one promise): an unknown outcome.
        let failure: TransportError =
            if let last = self.goAwayLast, streamID > last {
                self.goneAway(last)
            } else if refusedAfterGoAway {
                .notSentGoingAway
            } else {
                TransportError(
                    code: .connectionReset,
                    mayHaveBeenProcessed: true,
                    message: "the connection failed while the request was being written: \(error)"
                )
            }
        return self.end(streamID, failing: failure, now: now)
    }

    // MARK: Frames

    /// A HEADERS frame; `status` is its `:status`, if any (informational ones are skipped).
    mutating func headers(
        _ streamID: HTTP2StreamID,
        status: Int?,
        headers: HPACKHeaders,
        endStream: Bool,
        now: NIODeadline
    ) -> Completion? {
        guard self.exchanges[streamID] != nil else { return nil }
        if let status, status >= 200, self.exchanges[streamID]!.status == nil {
            self.exchanges[streamID]!.status = status
            self.exchanges[streamID]!.headers = headers
        }
        return endStream ? self.complete(streamID, now: now) : nil
    }

    /// A DATA frame.
    mutating func data(
        _ streamID: HTTP2StreamID,
        _ bytes: ByteBuffer?,
        endStream: Bool,
        now: NIODeadline
    )
        -> Completion?
    {
        guard self.exchanges[streamID] != nil else { return nil }
        if let bytes { self.exchanges[streamID]!.body += bytes.readableBytesView }
        return endStream ? self.complete(streamID, now: now) : nil
    }

    /// RST_STREAM from the peer.
    mutating func reset(_ streamID: HTTP2StreamID, code: HTTP2ErrorCode, now: NIODeadline) -> Completion? {
        self.end(
            streamID,
            failing: TransportError(
                code: .streamReset,
                mayHaveBeenProcessed: code != .refusedStream,
                message: "\(self.peer) reset the stream (\(code))"
            ),
            now: now
        )
    }

    /// GOAWAY: the streams above `last` were not processed and end now, to be resent; no new ones open.
    mutating func goAway(last: HTTP2StreamID, now: NIODeadline) -> [Completion] {
        self.goAwayLast = last
        return self.exchanges.keys.filter { $0 > last }.sorted().compactMap {
            self.end($0, failing: self.goneAway(last), now: now)
        }
    }

    /// NIO closed a stream (`reason`: the error code it closed with, if any).
    mutating func streamClosed(_ streamID: HTTP2StreamID, reason: HTTP2ErrorCode?, now: NIODeadline) -> Completion? {
        guard self.exchanges[streamID] != nil else { return nil }
        let failure: TransportError =
            if let last = self.goAwayLast, streamID > last {
                self.goneAway(last)
            } else if let reason {
                TransportError(
                    code: .streamReset,
                    mayHaveBeenProcessed: reason != .refusedStream,
                    message: "the stream closed: \(reason)"
                )
            } else {
                Self.unknownOutcome("the stream closed before a response")
            }
        return self.end(streamID, failing: failure, now: now)
    }

    /// The connection is gone: streams above a GOAWAY's last-stream-id were not processed, the rest may
    /// have been (a 200 already read is still the answer). Later openings are refused.
    mutating func connectionClosed(now: NIODeadline) -> [Completion] {
        self.closed = true
        self.timerArmed = false
        self.deadlines.removeAll()
        return self.exchanges.keys.sorted().compactMap { streamID in
            let failure =
                if let last = self.goAwayLast, streamID > last {
                    self.goneAway(last)
                } else {
                    Self.unknownOutcome("the connection closed mid-request")
                }
            return self.end(streamID, failing: failure, now: now)
        }
    }

    // MARK: Callers and time

    /// The callers of the requests `matching` gave up: each ends as an unknown outcome (it may have reached
    /// the peer); the caller resets their streams (the completions' stream ids).
    mutating func cancel(where matching: (Waiter) -> Bool, now: NIODeadline) -> [Completion] {
        self.exchanges.filter { matching($0.value.slot) }.keys.sorted().compactMap {
            self.end($0, failing: Self.unknownOutcome("the request was cancelled while in flight"), now: now)
        }
    }

    /// The deadline timer fired at `now`; `lastStall` is when this process last came out of a stall.
    mutating func deadlineFired(now: NIODeadline, lastStall: NIODeadline?) -> Expiry {
        var expiry = Expiry()
        self.dropFinishedDeadlines()
        guard let head = self.deadlines.first, head.at <= now else {
            expiry.armTimer = self.rearm()
            return expiry
        }
        // The timer fired late: this process was stalled (SIGSTOP, a VM pause, a throttled container), and
        // the answers the peer sent meanwhile may be waiting unread in the socket. A deadline that passed
        // while nothing here could run is no evidence against the request: each overdue stream gets one
        // grace period in which its answer can be read. Timing them out now would send delivered pushes
        // again. A deadline falling due just after such a stall gets the same grace: after a long freeze the
        // event loop has a backlog to read before it reaches this socket.
        let stalled = now - head.at > Self.stallThreshold || lastStall.map { now - $0 < Self.stallGrace } ?? false
        let graceFrom = max(now, lastStall ?? now)
        var moved: [Deadline] = []
        while let due = self.deadlines.first, due.at <= now {
            self.deadlines.removeFirst()
            guard let exchange = self.exchanges[due.streamID] else { continue }
            switch due.phase {
            case .opened where stalled, .lastLook where stalled:
                moved.append((due.streamID, graceFrom + Self.stallGrace, .extended))
            case .opened:
                moved.append((due.streamID, now + Self.lastLook, .lastLook))
            case .lastLook, .extended:
                let failure = TransportError(
                    code: .timeout,
                    mayHaveBeenProcessed: true,
                    message: "no response within \(Duration.nanoseconds(exchange.timeout.nanoseconds))"
                )
                // Reset either way: a stream whose 200 was read but whose END_STREAM never came is delivered.
                if let completion = self.end(due.streamID, failing: failure, now: now) {
                    expiry.completions.append(completion)
                    expiry.resets.append(due.streamID)
                }
            }
        }
        self.insert(moved)
        expiry.armTimer = self.rearm()
        return expiry
    }

    // MARK: Internals

    /// Puts deadlines (all at one instant, or one) in their place, keeping the earliest first.
    private mutating func insert(_ moved: [Deadline]) {
        guard let at = moved.first?.at else { return }
        if let last = self.deadlines.last, last.at > at {
            let index = self.deadlines.firstIndex { $0.at > at } ?? self.deadlines.endIndex
            self.deadlines.insert(contentsOf: moved, at: index)
        } else {
            self.deadlines.append(contentsOf: moved)
        }
    }

    private mutating func dropFinishedDeadlines() {
        while let head = self.deadlines.first, self.exchanges[head.streamID] == nil { self.deadlines.removeFirst() }
    }

    /// The next instant the timer must fire at, or `nil` (disarmed) when nothing is timed.
    private mutating func rearm() -> NIODeadline? {
        self.dropFinishedDeadlines()
        self.timerArmed = self.deadlines.first != nil && !self.closed
        return self.timerArmed ? self.deadlines.first?.at : nil
    }

    /// Completes a stream whose `:status 200` was read though its END_STREAM never came (a reset, a close).
    private mutating func completeIfAnsweredOK(_ streamID: HTTP2StreamID, now: NIODeadline) -> Completion? {
        guard self.exchanges[streamID]?.status == 200 else { return nil }
        return self.complete(streamID, now: now)
    }

    private mutating func complete(_ streamID: HTTP2StreamID, now: NIODeadline) -> Completion? {
        guard let exchange = self.exchanges[streamID] else { return nil }
        guard let status = exchange.status else {
            return self.finish(streamID, .failure(Self.unknownOutcome("the stream ended without a status")))
        }
        let answer = HTTP2Answer(
            status: status,
            headers: exchange.headers,
            body: exchange.body,
            latency: now - exchange.opened
        )
        return self.finish(streamID, .success(answer))
    }

    /// Ends a stream that got no complete answer, the one place for the rule: a `:status 200` already read is
    /// the answer (the push was delivered; anything else would send it again), even when the stream then
    /// resets, closes, times out, is cancelled, lies above a GOAWAY's last id, or its write fails; otherwise
    /// `failure`.
    private mutating func end(
        _ streamID: HTTP2StreamID,
        failing failure: TransportError,
        now: NIODeadline
    ) -> Completion? {
        if let answered = self.completeIfAnsweredOK(streamID, now: now) { return answered }
        return self.finish(streamID, .failure(failure))
    }

    private mutating func finish(
        _ streamID: HTTP2StreamID,
        _ result: Result<HTTP2Answer, TransportError>
    ) -> Completion? {
        guard let exchange = self.exchanges.removeValue(forKey: streamID) else { return nil }
        return Completion(streamID: streamID, slot: exchange.slot, result: result)
    }

    func goneAway(_ last: HTTP2StreamID) -> TransportError {
        TransportError(
            code: .goAway,
            mayHaveBeenProcessed: false,
            message: "\(self.peer) closed the connection (GOAWAY, last stream \(last))"
        )
    }

    static func unknownOutcome(_ message: String) -> TransportError {
        TransportError(code: .connectionReset, mayHaveBeenProcessed: true, message: message)
    }
}

/// A peer's answer, as read off its stream: what a provider's response parser reads.
struct HTTP2Answer: Sendable {
    var status: Int
    var headers: HPACKHeaders
    var body: [UInt8]
    /// From the stream's opening to its end.
    var latency: TimeAmount
}
