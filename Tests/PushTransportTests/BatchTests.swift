import APNsSimulator
import Foundation
import PushCore
import Synchronization
import Testing

@testable import PushTransport

/// `APNsClient.sendBatch`: the worker's path for every job due now (the engine's `sendBatch`, which the worker
/// reaches as `APNsClient.sender`), its answers unwrapped to APNs' own: many requests per hop, answers handed
/// over on the event loop, and the same in-call rules as one `send` per request.
@Suite("Batches: every request answered once, with the in-call rules of a single send")
struct BatchTests {
    /// Sends `tokens` as one batch; returns each request's results (exactly one each, or the test fails).
    static func sendBatch(_ f: Fixture, _ tokens: [String]) async throws -> [Result<APNsResponse, any Error>] {
        let requests = try tokens.map { try Fixture.alert($0) }
        let results = Mutex([[Result<APNsResponse, any Error>]](repeating: [], count: tokens.count))
        await f.client.sendBatch(requests, credential: "default", mayWrite: { true }) { index, result in
            results.withLock { $0[index].append(result) }
        }
        let all = results.withLock { $0 }
        for (index, answers) in all.enumerated() {
            #expect(answers.count == 1, "request \(index) was answered \(answers.count) times")
        }
        return all.map {
            $0.first ?? .failure(TransportError(code: .timeout, mayHaveBeenProcessed: true, message: "none"))
        }
    }

    @Test(
        "a batch goes out together; a GOAWAY in its middle: what APNs did not process is resent and delivered; an expired token is re-minted; every request answered once"
    )
    func goAwayAndExpiredTokenMidBatch() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            f.simulator.resetStreamHighWater()
            var tokens = (0..<40).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(100))) }
            let expired = Fixture.token()
            f.simulator.script(expired, .failThenSucceed(times: 1, status: 403, reason: "ExpiredProviderToken"))
            // GOAWAY once, naming the stream before this one as the last processed: this request and the
            // batch's later ones were not processed, and must be resent (on a new connection) and delivered.
            let goAway = Fixture.token()
            f.simulator.script(goAway, .times(1, .goAway))
            // A key id APNs does not relate to the token: one reconnect. Another process's token taken first:
            // with no store to adopt from, the 429 stands.
            let unrelated = Fixture.token()
            f.simulator.script(unrelated, .failThenSucceed(times: 1, status: 403, reason: "UnrelatedKeyIdInToken"))
            let tooMany = Fixture.token()
            f.simulator.script(tooMany, .failThenSucceed(times: 1, status: 429, reason: "TooManyProviderTokenUpdates"))
            // The GOAWAY comes after the others: a request behind it is not processed, and its resend would
            // meet a script already spent.
            tokens.insert(expired, at: 5)
            tokens.insert(unrelated, at: 10)
            tokens.insert(tooMany, at: 15)
            tokens.insert(goAway, at: 25)
            let results = try await Self.sendBatch(f, tokens)
            for (index, result) in results.enumerated() {
                let expected = tokens[index] == tooMany ? 429 : 200
                #expect((try? result.get().status) == expected, "request \(index): \(result)")
            }
            let seen = f.simulator.requests.filter { tokens.contains($0.deviceToken ?? "") }.count
            #expect(seen > tokens.count + 1, "the requests after the GOAWAY were resent: \(seen) requests")
            #expect(f.simulator.connectionsAccepted > 1, "a new connection replaced the one that went away")
            #expect(f.simulator.maxConcurrentStreamsSeen > 10, "the batch's requests were in flight together")
        }
    }

    @Test(
        "a cancelled batch: its requests in flight are reset and come back as unknown outcomes; none is left unanswered"
    )
    func cancelledBatch() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            let tokens = (0..<20).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .hang) }
            let sending = Task { try await Self.sendBatch(f, tokens) }
            let inFlight = Set(tokens)
            for _ in 0..<500
            where f.simulator.requests.filter({ inFlight.contains($0.deviceToken ?? "") }).count < tokens.count {
                try await Task.sleep(for: .milliseconds(5))
            }
            sending.cancel()
            let results = try await sending.value
            for (index, result) in results.enumerated() {
                guard case .failure(let error as TransportError) = result else {
                    Issue.record("request \(index): expected an unknown outcome, got \(result)")
                    continue
                }
                #expect(error.fault == .unknownOutcome, "request \(index): \(error)")
            }
        }
    }

    @Test(
        "a batch larger than the connection allows, on fresh connections: one stream until the first 200, then the peer's limit; every slot given back; the spare connection opens beside it"
    )
    func largerThanTheLimit() async throws {
        try await Fixture.run(simulator: { $0.authenticatedMaxStreams = 8 }, client: { $0.connectionsPerPool = 2 }) {
            f in
            let tokens = (0..<60).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(20))) }
            let results = try await Self.sendBatch(f, tokens)
            #expect(results.allSatisfy { (try? $0.get().status) == 200 })
            #expect(f.simulator.maxConcurrentStreamsSeen <= 16, "at most 8 streams on each of 2 connections")
            #expect(f.simulator.maxConcurrentStreamsSeen > 1, "the batch fanned out once authenticated")
            let pool = f.client.pool(
                for: .init(endpoint: APNsEndpoint(host: "localhost", port: f.simulator.port), credential: "default")
            )
            #expect(pool.openCount == 2, "the second connection opened in the background")
            // The slots come back through the exchange once per read cycle: poll briefly for the last flush.
            for _ in 0..<100 where try await pool.connection().limiter.inFlight > 0 {
                try await Task.sleep(for: .milliseconds(10))
            }
            #expect(try await pool.connection().limiter.inFlight == 0, "no stream slot leaked")
        }
    }

    @Test("a caller that may no longer write after the first group of a batch: the rest are withdrawn unsent")
    func mayWriteTurnsFalse() async throws {
        try await Fixture.run(simulator: { $0.authenticatedMaxStreams = 10 }) { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            // The first send's stream slot comes back at the end of the read cycle that delivered its answer:
            // wait for it, so the batch's first group gets all ten.
            let pool = f.client.pool(
                for: .init(endpoint: APNsEndpoint(host: "localhost", port: f.simulator.port), credential: "default")
            )
            for _ in 0..<100 where try await pool.connection().limiter.inFlight > 0 {
                try await Task.sleep(for: .milliseconds(10))
            }
            let tokens = (0..<30).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(200))) }
            let asked = Mutex(0)
            let requests = try tokens.map { try Fixture.alert($0) }
            let results = Mutex([Result<APNsResponse, any Error>?](repeating: nil, count: tokens.count))
            await f.client.sendBatch(
                requests,
                credential: "default",
                mayWrite: {
                    asked.withLock {
                        $0 += 1
                        return $0 == 1
                    }
                }
            ) { index, result in
                results.withLock { $0[index] = result }
            }
            let all = results.withLock { $0 }
            let delivered = all.filter { (try? $0?.get().status) == 200 }.count
            let withdrawn = all.filter {
                if case .failure(let error as TransportError) = $0 { error.code == .shutdown } else { false }
            }.count
            #expect(delivered == 10 && withdrawn == 20, "\(delivered) delivered, \(withdrawn) withdrawn")
        }
    }

    @Test("a connection dropped mid-batch: every request in flight comes back once, as an unknown outcome")
    func droppedMidBatch() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            var tokens = (0..<20).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.seconds(2))) }
            let dropper = Fixture.token()
            f.simulator.script(dropper, .dropConnection)
            tokens.append(dropper)
            let results = try await Self.sendBatch(f, tokens)
            for (index, result) in results.enumerated() {
                guard case .failure(let error as TransportError) = result else {
                    Issue.record("request \(index): expected an unknown outcome, got \(result)")
                    continue
                }
                #expect(error.fault == .unknownOutcome, "request \(index): \(error)")
            }
        }
    }

    @Test("a batch for a credential with no key: every request fails MS028 at once, nothing sent")
    func missingCredential() async throws {
        try await Fixture.run { f in
            let requests = try (0..<3).map { _ in try Fixture.alert(Fixture.token()) }
            let results = Mutex([TransportError.Code?](repeating: nil, count: 3))
            await f.client.sendBatch(requests, credential: "nobody", mayWrite: { true }) { index, result in
                if case .failure(let error as TransportError) = result { results.withLock { $0[index] = error.code } }
            }
            #expect(results.withLock { $0 } == [.credentialsMissing, .credentialsMissing, .credentialsMissing])
            #expect(f.simulator.requests.isEmpty)
        }
    }

    @Test("a batch whose caller may not write (a stale heartbeat): withdrawn unsent, each one")
    func withdrawn() async throws {
        try await Fixture.run { f in
            let requests = try (0..<5).map { _ in try Fixture.alert(Fixture.token()) }
            let codes = Mutex([TransportError.Code?](repeating: nil, count: 5))
            await f.client.sendBatch(requests, credential: "default", mayWrite: { false }) { index, result in
                if case .failure(let error as TransportError) = result { codes.withLock { $0[index] = error.code } }
            }
            #expect(codes.withLock { $0 }.allSatisfy { $0 == .shutdown })
            #expect(f.simulator.requests.isEmpty)
        }
    }
}
