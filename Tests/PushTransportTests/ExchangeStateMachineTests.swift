import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import PushCore
import Testing

@testable import PushTransport

/// The HTTP/2 exchange's rules, event by event, with no socket and no clock: every ending decided once,
/// "not processed" only where that is certain.
@Suite("The exchange state machine, event by event")
struct ExchangeStateMachineTests {
    typealias Machine = ExchangeStateMachine<Int>
    let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000_000)
    let timeout = TimeAmount.seconds(10)

    static func status(_ code: Int) -> HPACKHeaders { [":status": "\(code)"] }

    func opened(_ machine: inout Machine, _ waiter: Int, at now: NIODeadline) -> (HTTP2StreamID, NIODeadline?) {
        guard case .write(let stream, let arm) = machine.open(waiter, now: now, timeout: self.timeout) else {
            Issue.record("request \(waiter) was refused a stream")
            return (.rootStream, nil)
        }
        return (stream, arm)
    }

    @Test(
        "streams are numbered 1, 3, 5; the timer is armed once, for the first deadline; a 200 is the answer with its latency"
    )
    func opensAndAnswers() {
        var machine = Machine(peer: "APNs")
        let (s1, arm1) = self.opened(&machine, 10, at: self.t0)
        let (s3, arm3) = self.opened(&machine, 11, at: self.t0 + .seconds(1))
        #expect(s1 == 1 && s3 == 3)
        #expect(arm1 == self.t0 + self.timeout)
        #expect(arm3 == nil, "one timer serves the queue's head")
        let done = machine.headers(
            s1,
            status: 200,
            headers: Self.status(200),
            endStream: true,
            now: self.t0 + .milliseconds(40)
        )
        #expect(done?.slot == 10)
        let answer = try? done?.result.get()
        #expect(answer?.status == 200 && answer?.latency == .milliseconds(40))
        #expect(machine.inFlight == 1)
        // A second ending for the same stream finds nothing: each request ends once.
        #expect(machine.reset(s1, code: .cancel, now: self.t0 + .seconds(2)) == nil)
    }

    @Test("an error answer carries its body across DATA frames; a HEADERS without END_STREAM waits for the DATA")
    func errorBody() throws {
        var machine = Machine(peer: "APNs")
        let (s, _) = self.opened(&machine, 1, at: self.t0)
        #expect(machine.headers(s, status: 100, headers: Self.status(100), endStream: false, now: self.t0) == nil)
        #expect(machine.headers(s, status: 410, headers: Self.status(410), endStream: false, now: self.t0) == nil)
        #expect(machine.data(s, ByteBuffer(string: #"{"reason":"#), endStream: false, now: self.t0) == nil)
        let done = machine.data(s, ByteBuffer(string: #""Unregistered"}"#), endStream: true, now: self.t0)
        let answer = try #require(try done?.result.get())
        #expect(answer.status == 410, "the informational 100 is skipped")
        #expect(String(decoding: answer.body, as: UTF8.self) == #"{"reason":"Unregistered"}"#)
    }

    @Test("a 200 read before a reset, a close or a dropped connection is still a delivery")
    func answeredOKSurvives() {
        var machine = Machine(peer: "APNs")
        let (a, _) = self.opened(&machine, 1, at: self.t0)
        let (b, _) = self.opened(&machine, 2, at: self.t0)
        let (c, _) = self.opened(&machine, 3, at: self.t0)
        for s in [a, b, c] {
            #expect(machine.headers(s, status: 200, headers: Self.status(200), endStream: false, now: self.t0) == nil)
        }
        #expect((try? machine.reset(a, code: .internalError, now: self.t0)?.result.get())?.status == 200)
        #expect((try? machine.streamClosed(b, reason: .cancel, now: self.t0)?.result.get())?.status == 200)
        let closed = machine.connectionClosed(now: self.t0)
        #expect(closed.count == 1 && (try? closed[0].result.get())?.status == 200)
    }

    @Test("REFUSED_STREAM is not processed; any other reset, a close without status or a dropped connection is unknown")
    func resetsAndCloses() {
        var machine = Machine(peer: "APNs")
        let streams = (0..<4).map { self.opened(&machine, $0, at: self.t0).0 }
        let refused = machine.reset(streams[0], code: .refusedStream, now: self.t0)
        #expect(Self.failure(refused)?.fault == .notProcessed)
        let cancelled = machine.reset(streams[1], code: .cancel, now: self.t0)
        #expect(Self.failure(cancelled)?.fault == .unknownOutcome)
        #expect(Self.failure(cancelled)?.message.contains("APNs reset the stream") == true)
        let noStatus = machine.streamClosed(streams[2], reason: nil, now: self.t0)
        #expect(Self.failure(noStatus)?.fault == .unknownOutcome)
        let dropped = machine.connectionClosed(now: self.t0)
        #expect(dropped.map(\.slot) == [3] && Self.failure(dropped.first)?.fault == .unknownOutcome)
        guard case .refuse(let error, _) = machine.open(9, now: self.t0, timeout: self.timeout) else {
            Issue.record("a closed connection opened a stream")
            return
        }
        #expect(error.fault == .notProcessed)
    }

    @Test(
        "GOAWAY: streams above its last id end not processed at once; the rest stay; new ones are refused; a later drop leaves them unknown"
    )
    func goAway() {
        var machine = Machine(peer: "APNs")
        let streams = (0..<4).map { self.opened(&machine, $0, at: self.t0).0 }  // 1, 3, 5, 7
        let gone = machine.goAway(last: streams[1], now: self.t0)
        #expect(gone.map(\.slot) == [2, 3])
        #expect(gone.allSatisfy { Self.failure($0)?.fault == .notProcessed })
        guard case .refuse(let error, let close) = machine.open(9, now: self.t0, timeout: self.timeout) else {
            Issue.record("a stream opened after GOAWAY")
            return
        }
        #expect(error.fault == .notProcessed && !close)
        // A write that fails for a stream above the last id is not processed either.
        #expect(
            machine.writeFailed(streams[3], refusedAfterGoAway: false, error: "x", now: self.t0) == nil,
            "already ended"
        )
        let answered = machine.headers(
            streams[0],
            status: 200,
            headers: Self.status(200),
            endStream: true,
            now: self.t0
        )
        #expect(answered?.slot == 0)
        let dropped = machine.connectionClosed(now: self.t0)
        #expect(dropped.map(\.slot) == [1] && Self.failure(dropped.first)?.fault == .unknownOutcome)
    }

    @Test(
        "a failed write is not processed only where that is certain (NIO refused the stream after GOAWAY); a 200 read first stands"
    )
    func writeFailures() {
        var machine = Machine(peer: "APNs")
        let (a, _) = self.opened(&machine, 1, at: self.t0)
        let (b, _) = self.opened(&machine, 2, at: self.t0)
        let (c, _) = self.opened(&machine, 3, at: self.t0)
        _ = machine.headers(c, status: 200, headers: Self.status(200), endStream: false, now: self.t0)
        let answered = machine.writeFailed(c, refusedAfterGoAway: false, error: "x", now: self.t0)
        #expect((try? answered?.result.get())?.status == 200)
        #expect(
            Self.failure(machine.writeFailed(a, refusedAfterGoAway: true, error: "x", now: self.t0))?.fault
                == .notProcessed
        )
        #expect(
            Self.failure(machine.writeFailed(b, refusedAfterGoAway: false, error: "x", now: self.t0))?.fault
                == .unknownOutcome
        )
    }

    @Test(
        "deadlines: the head gets a last look, then times out (unknown, reset), the timer moves to the next; a late timer or a recent stall gives one grace period"
    )
    func deadlines() {
        var machine = Machine(peer: "APNs")
        let (a, _) = self.opened(&machine, 1, at: self.t0)
        let (b, _) = self.opened(&machine, 2, at: self.t0 + .seconds(4))
        let due = machine.deadlineFired(now: self.t0 + self.timeout, lastStall: nil)
        #expect(due.completions.isEmpty && due.armTimer == self.t0 + self.timeout + .milliseconds(300), "a last look")
        let first = machine.deadlineFired(now: self.t0 + self.timeout + .milliseconds(300), lastStall: nil)
        #expect(first.resets == [a] && first.completions.map(\.slot) == [1])
        #expect(
            first.completions.allSatisfy {
                Self.failure($0)?.code == .timeout && Self.failure($0)?.fault == .unknownOutcome
            }
        )
        #expect(first.armTimer == self.t0 + .seconds(14))
        // The process was frozen: the timer fires 5 s late. No timeout yet: the answer may be unread.
        let late = self.t0 + .seconds(19)
        let frozen = machine.deadlineFired(now: late, lastStall: nil)
        #expect(frozen.completions.isEmpty && frozen.armTimer == late + .seconds(2))
        let answered = machine.headers(
            b,
            status: 200,
            headers: Self.status(200),
            endStream: true,
            now: late + .seconds(1)
        )
        #expect(answered?.slot == 2, "the answer read in the grace period is the answer")
        #expect(
            machine.deadlineFired(now: late + .seconds(2), lastStall: nil).armTimer == nil,
            "nothing left: disarmed"
        )

        // On time, but the process came out of a stall a moment ago: the same grace, counted from the stall.
        let (c, arm) = self.opened(&machine, 3, at: self.t0 + .seconds(30))
        #expect(arm == self.t0 + .seconds(40), "re-armed by the first opening after it was disarmed")
        let stalled = machine.deadlineFired(now: self.t0 + .seconds(40), lastStall: self.t0 + .milliseconds(39_500))
        #expect(stalled.completions.isEmpty && stalled.armTimer == self.t0 + .seconds(42))
        // Each stream is extended once: the second firing times it out.
        let second = machine.deadlineFired(now: self.t0 + .seconds(42), lastStall: self.t0 + .milliseconds(41_500))
        #expect(second.resets == [c])

        // A freeze that ended just after the deadline: the timer fires 490 ms late, before the stall detector
        // (another thread, out of the same freeze) has noticed. Still a stall: the unread 200 gets its grace.
        let (d, _) = self.opened(&machine, 4, at: self.t0 + .seconds(50))
        let thawed = machine.deadlineFired(now: self.t0 + .milliseconds(60_490), lastStall: nil)
        #expect(thawed.completions.isEmpty, "490 ms late: a stall, not a timeout")
        let read = machine.headers(d, status: 200, headers: Self.status(200), endStream: true, now: thawed.armTimer!)
        #expect(read?.slot == 4)
        // A timer a few milliseconds late (a busy loop) is on time: a last look, then the timeout.
        let (e, _) = self.opened(&machine, 5, at: self.t0 + .seconds(70))
        let busy = machine.deadlineFired(now: self.t0 + .milliseconds(80_020), lastStall: nil)
        #expect(busy.completions.isEmpty && busy.armTimer == self.t0 + .milliseconds(80_320))
        #expect(machine.deadlineFired(now: self.t0 + .milliseconds(80_320), lastStall: nil).resets == [e])

        // Thawed just before the deadline, with a backlog: the timer fires on time and the stall detector has
        // not said so yet. The last look finds the stall, and the stream gets the grace; its 200 is read.
        let (f, _) = self.opened(&machine, 6, at: self.t0 + .seconds(90))
        let onTime = machine.deadlineFired(now: self.t0 + .seconds(100), lastStall: nil)
        #expect(onTime.completions.isEmpty)
        let looked = machine.deadlineFired(
            now: self.t0 + .milliseconds(100_300),
            lastStall: self.t0 + .milliseconds(100_050)
        )
        #expect(looked.completions.isEmpty && looked.armTimer == self.t0 + .milliseconds(102_300))
        let late200 = machine.headers(
            f,
            status: 200,
            headers: Self.status(200),
            endStream: true,
            now: self.t0 + .seconds(101)
        )
        #expect(late200?.slot == 6, "the answer read in the grace is the answer")
    }

    @Test(
        "stream ids used up: new requests refused (not processed), and the connection closes once its last answer is in"
    )
    func streamIDsRunOut() {
        var machine = Machine(peer: "APNs", firstStreamID: Machine.lastStreamID)
        let (last, _) = self.opened(&machine, 1, at: self.t0)
        guard case .refuse(let error, let close) = machine.open(2, now: self.t0, timeout: self.timeout) else {
            Issue.record("a stream id past the range")
            return
        }
        #expect(error.fault == .notProcessed && !close, "one still in flight: not closed yet")
        #expect(!machine.isSpentAndIdle)
        _ = machine.headers(last, status: 200, headers: Self.status(200), endStream: true, now: self.t0)
        #expect(machine.isSpentAndIdle)
        guard case .refuse(_, let closeNow) = machine.open(3, now: self.t0, timeout: self.timeout) else { return }
        #expect(closeNow)
    }

    @Test("a caller that gives up: its requests in flight end as unknown outcomes, in stream order; the others stay")
    func cancellation() {
        var machine = Machine(peer: "APNs")
        for waiter in [4, 7, 6, 9] { _ = self.opened(&machine, waiter, at: self.t0) }
        let cancelled = machine.cancel(where: { $0 % 2 == 0 }, now: self.t0)
        #expect(cancelled.map(\.slot) == [4, 6])
        #expect(cancelled.allSatisfy { Self.failure($0)?.fault == .unknownOutcome })
        #expect(machine.inFlight == 2)
    }

    /// Random interleavings of every event, from a printed seed: each request ends exactly once, a 200
    /// read is never reported as a failure, and nothing above a GOAWAY's last id is called unknown.
    @Test("generated event sequences: every request ends once, with its rules", arguments: Array(UInt64(1)...64))
    func generated(seed: UInt64) {
        var random = SplitMix(seed: seed)
        var machine = Machine(peer: "APNs")
        var now = self.t0
        var next = 0
        var open: [Int: HTTP2StreamID] = [:]
        var saw200: Set<Int> = []
        var ended: [Int: Result<HTTP2Answer, TransportError>] = [:]
        var goAwayLast: HTTP2StreamID?
        var streamOf: [Int: HTTP2StreamID] = [:]
        var firstStatus: [Int: Int] = [:]
        func record(_ completions: [Machine.Completion]) {
            for completion in completions {
                if case .failure(let error) = completion.result, let last = goAwayLast,
                    streamOf[completion.slot]! > last
                {
                    #expect(error.fault == .notProcessed, "seed \(seed): \(completion.slot) above the GOAWAY: \(error)")
                }
                #expect(ended[completion.slot] == nil, "seed \(seed): request \(completion.slot) ended twice")
                ended[completion.slot] = completion.result
                open[completion.slot] = nil
            }
        }
        for _ in 0..<400 {
            now = now + .milliseconds(Int64(random.next(below: 400)))
            let target = open.keys.sorted().randomElement(using: &random)
            switch random.next(below: 10) {
            case 0, 1, 2:
                if case .write(let stream, _) = machine.open(next, now: now, timeout: self.timeout) {
                    open[next] = stream
                    streamOf[next] = stream
                }
                next += 1
            case 3:
                guard let target else { continue }
                let status = [200, 200, 400, 410, 500][Int(random.next(below: 5))]
                let end = random.next(below: 2) == 0
                // The first final status is the answer; a later HEADERS does not change it.
                if firstStatus[target] == nil { firstStatus[target] = status }
                if firstStatus[target] == 200 { saw200.insert(target) }
                record(
                    [
                        machine.headers(
                            open[target]!,
                            status: status,
                            headers: Self.status(status),
                            endStream: end,
                            now: now
                        )
                    ].compactMap { $0 }
                )
            case 4:
                guard let target else { continue }
                record(
                    [machine.data(open[target]!, ByteBuffer(string: "{}"), endStream: true, now: now)].compactMap { $0 }
                )
            case 5:
                guard let target else { continue }
                let code: HTTP2ErrorCode = random.next(below: 2) == 0 ? .refusedStream : .cancel
                record([machine.reset(open[target]!, code: code, now: now)].compactMap { $0 })
            case 6:
                guard let target, goAwayLast == nil, random.next(below: 4) == 0 else { continue }
                let last = open[target]!
                let gone = machine.goAway(last: last, now: now)
                goAwayLast = last
                record(gone)
            case 7:
                guard let target else { continue }
                if random.next(below: 2) == 0 {
                    record([machine.streamClosed(open[target]!, reason: nil, now: now)].compactMap { $0 })
                } else {
                    let refused = random.next(below: 2) == 0
                    record(
                        [machine.writeFailed(open[target]!, refusedAfterGoAway: refused, error: "x", now: now)]
                            .compactMap { $0 }
                    )
                }
            case 8:
                let lateBy = random.next(below: 3) == 0 ? TimeAmount.seconds(3) : .zero
                now = now + lateBy
                record(machine.deadlineFired(now: now, lastStall: nil).completions)
            default:
                guard let target else { continue }
                record(machine.cancel(where: { $0 == target }, now: now))
            }
        }
        record(machine.connectionClosed(now: now))
        #expect(ended.count == streamOf.count, "seed \(seed): every opened request ended")
        for (waiter, result) in ended {
            if saw200.contains(waiter) {
                // A 200 read first wins over any later ending; one read after another status is ignored.
                if case .failure(let error) = result {
                    #expect(Bool(false), "seed \(seed): request \(waiter) read a 200 and ended \(error)")
                }
            }
        }
    }

    static func failure(_ completion: Machine.Completion?) -> TransportError? {
        guard case .failure(let error) = completion?.result else { return nil }
        return error
    }
}

/// A small seeded generator (SplitMix64): the same seed, the same events.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { self.state = seed }
    mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E7B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func next(below bound: UInt64) -> UInt64 { self.next() % bound }
}

/// ``FrameExchange`` on an `EmbeddedChannel`: frames in, frames out, time advanced by hand.
@Suite("The frame exchange on an embedded channel")
struct FrameExchangeTests {
    final class Collected: @unchecked Sendable {
        var results: [Int: Result<HTTP2Answer, TransportError>] = [:]
        var released = 0
    }

    /// Collects the answers the exchange hands over.
    final class Sink: AnswerSink, @unchecked Sendable {
        let collected: Collected
        init(_ collected: Collected) { self.collected = collected }
        var isCancelled: Bool { false }
        func expect(_ count: Int, on exchange: FrameExchange.Handle) {}
        func deliver(_ index: Int, _ result: Result<HTTP2Answer, TransportError>) {
            self.collected.results[index] = result
        }
    }

    final class Stall: @unchecked Sendable {
        var at: NIODeadline?
    }

    func setUp(
        lastStall: @escaping () -> NIODeadline? = { nil }
    ) throws -> (EmbeddedChannel, FrameExchange, Sink, Collected) {
        let collected = Collected()
        let exchange = FrameExchange(peer: "APNs", lastStall: lastStall)
        exchange.slotsReleased = { collected.released += $0 }
        let channel = EmbeddedChannel(handler: exchange)
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 443)).wait()
        let batch = Sink(collected)
        return (channel, exchange, batch, collected)
    }

    static let request: HPACKHeaders = [":method": "POST", ":path": "/3/device/ab"]

    func outbound(_ channel: EmbeddedChannel) throws -> [HTTP2Frame] {
        var frames: [HTTP2Frame] = []
        while let frame = try channel.readOutbound(as: HTTP2Frame.self) { frames.append(frame) }
        return frames
    }

    @Test(
        "requests go out as HEADERS + DATA on streams 1, 3, 5; a 200 is delivered; the rest time out with RST_STREAM CANCEL"
    )
    func writesAnswersAndTimesOut() throws {
        let (channel, exchange, batch, collected) = try self.setUp()
        for index in 0..<3 {
            exchange.start(
                headers: Self.request,
                body: Array("{}".utf8),
                timeout: .seconds(10),
                slot: .init(batch: batch, index: index)
            )
        }
        exchange.flushWrites()
        let written = try self.outbound(channel)
        #expect(written.map(\.streamID) == [1, 1, 3, 3, 5, 5])
        if case .data(let data) = written[1].payload { #expect(data.endStream) } else { Issue.record("DATA expected") }

        try channel.writeInbound(
            HTTP2Frame(
                streamID: 3,
                payload: .headers(
                    .init(
                        headers: [":status": "200", "apns-id": "5E5B6A4E-2B41-4C2B-8C3A-3C3B0E6E8E11"],
                        endStream: true
                    )
                )
            )
        )
        channel.pipeline.fireChannelReadComplete()
        #expect((try? collected.results[1]?.get())?.status == 200)
        #expect((try? collected.results[1]?.get()).map(APNsResponse.init)?.apnsID != nil)
        #expect(collected.released == 1, "the slot came back at the end of the read cycle")

        channel.embeddedEventLoop.advanceTime(by: .seconds(9))
        #expect(collected.results.count == 1)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(collected.results.count == 1, "due: a last look first")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(300))
        #expect(collected.results.count == 3)
        for index in [0, 2] {
            guard case .failure(let error) = collected.results[index] else {
                Issue.record("request \(index) was not timed out")
                continue
            }
            #expect(error.code == .timeout && error.mayHaveBeenProcessed)
        }
        let resets = try self.outbound(channel)
        #expect(resets.map(\.streamID) == [1, 5])
        #expect(resets.allSatisfy { if case .rstStream(.cancel) = $0.payload { true } else { false } })
        #expect(collected.released == 3 && exchange.inFlight == 0)
        _ = try? channel.finish()
    }

    @Test(
        "a process that just came out of a stall: an overdue stream gets two more seconds, and its late 200 is delivered"
    )
    func stallGrace() throws {
        let stall = Stall()
        let (channel, exchange, batch, collected) = try self.setUp(lastStall: { stall.at })
        exchange.start(headers: Self.request, body: [], timeout: .seconds(1), slot: .init(batch: batch, index: 0))
        exchange.flushWrites()
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(500))
        stall.at = channel.embeddedEventLoop.now
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(500))
        #expect(collected.results[0] == nil, "the deadline fell due just after a stall: extended")
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        try channel.writeInbound(
            HTTP2Frame(streamID: 1, payload: .headers(.init(headers: [":status": "200"], endStream: true)))
        )
        #expect((try? collected.results[0]?.get())?.status == 200)
        #expect(try self.outbound(channel).allSatisfy { if case .rstStream = $0.payload { false } else { true } })
        _ = try? channel.finish()
    }

    @Test(
        "a deadline on time: the stream's 200 read in the last look (a thawed loop's backlog ran first) is the answer, not a timeout"
    )
    func lastLook() throws {
        let (channel, exchange, batch, collected) = try self.setUp(lastStall: { nil })
        exchange.start(headers: Self.request, body: [], timeout: .seconds(1), slot: .init(batch: batch, index: 0))
        exchange.start(headers: Self.request, body: [], timeout: .seconds(1), slot: .init(batch: batch, index: 1))
        exchange.flushWrites()
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(collected.results.isEmpty, "due, not yet timed out")
        try channel.writeInbound(
            HTTP2Frame(streamID: 1, payload: .headers(.init(headers: [":status": "200"], endStream: true)))
        )
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(299))
        #expect((try? collected.results[0]?.get())?.status == 200)
        #expect(collected.results[1] == nil)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        guard case .failure(let error) = collected.results[1] else {
            Issue.record("the unanswered stream times out after its last look")
            return
        }
        #expect(error.code == .timeout && error.mayHaveBeenProcessed)
        let resets = try self.outbound(channel).filter { if case .rstStream = $0.payload { true } else { false } }
        #expect(resets.map(\.streamID) == [3])
        _ = try? channel.finish()
    }

    @Test(
        "GOAWAY: streams above the last id come back not processed; a new request is refused; closing leaves the rest unknown"
    )
    func goAwayAndClose() throws {
        let (channel, exchange, batch, collected) = try self.setUp()
        for index in 0..<3 {
            exchange.start(
                headers: Self.request,
                body: [],
                timeout: .seconds(10),
                slot: .init(batch: batch, index: index)
            )
        }
        exchange.flushWrites()
        try channel.writeInbound(
            HTTP2Frame(streamID: .rootStream, payload: .goAway(lastStreamID: 1, errorCode: .noError, opaqueData: nil))
        )
        #expect(collected.results.keys.sorted() == [1, 2])
        #expect(
            collected.results.values.allSatisfy {
                if case .failure(let e) = $0 { e.fault == .notProcessed } else { false }
            }
        )
        exchange.start(headers: Self.request, body: [], timeout: .seconds(10), slot: .init(batch: batch, index: 3))
        if case .failure(let error) = collected.results[3] {
            #expect(error.fault == .notProcessed)
        } else {
            Issue.record("sent after GOAWAY")
        }
        _ = try? channel.close().wait()
        if case .failure(let error) = collected.results[0] {
            #expect(error.fault == .unknownOutcome)
        } else {
            Issue.record("stream 1 not ended")
        }
        #expect(collected.released == 4)
    }
}

@Suite("What an APNs answer does to its connection")
struct AnswerEffectTests {
    @Test(
        "the stream limit follows the reason's class: a 2xx proves the credential, a credential refusal drops it to one stream, anything else says nothing"
    )
    func credentialAccepted() {
        let cases: [(Int, String?, Bool?)] = [
            (200, nil, true), (201, nil, true), (403, "InvalidProviderToken", false),
            (403, "ExpiredProviderToken", false),
            (429, "TooManyProviderTokenUpdates", false), (403, "BadCertificate", false), (410, "Unregistered", nil),
            (400, "BadDeviceToken", nil), (429, "TooManyRequests", nil), (403, "SomethingNew", nil), (500, nil, nil),
        ]
        for (status, reason, accepted) in cases {
            #expect(
                APNsResponse(status: status, reason: reason).credentialAccepted == accepted,
                "\(status) \(reason ?? "-")"
            )
        }
        #expect(APNsResponse(status: 403, reason: "ExpiredProviderToken").connectionEffect == .reMintToken)
        #expect(APNsResponse(status: 200).connectionEffect == .none)
    }
}
