import APNsSimulator
import Foundation
import PushClockTesting
import PushCore
import PushQueueTesting
import Testing

@testable import PushTransport

@Suite("Connections: stream limits, sharing, GOAWAY and drops")
struct ConnectionTests {
    /// Sends `count` alerts at once and returns each result.
    func burst(_ f: Fixture, _ tokens: [String]) async -> [Result<APNsResponse, any Error>] {
        await withTaskGroup(of: (Int, Result<APNsResponse, any Error>).self) { group in
            for (index, token) in tokens.enumerated() {
                group.addTask {
                    do { return (index, .success(try await f.send(try Fixture.alert(token)))) } catch {
                        return (index, .failure(error))
                    }
                }
            }
            var results = [Result<APNsResponse, any Error>?](repeating: nil, count: tokens.count)
            for await (index, result) in group { results[index] = result }
            return results.map { $0! }
        }
    }

    @Test(
        "one stream until the first authenticated success, then the peer's SETTINGS; parallel sends share one connection"
    )
    func streamLimitWidens() async throws {
        try await Fixture.run(simulator: { $0.authenticatedMaxStreams = 500 }) { f in
            let slow = (0..<8).map { _ in Fixture.token() }
            for token in slow { f.simulator.script(token, .latency(.milliseconds(150))) }
            // Cold connection: one stream until the first request succeeds, then the rest at once.
            let first = await burst(f, slow)
            #expect(first.allSatisfy { (try? $0.get().status) == 200 })
            let arrivals = f.simulator.requests.map(\.receivedAt).sorted()
            #expect(
                arrivals[1].timeIntervalSince(arrivals[0]) >= 0.14,
                "the second request waited for the first answer"
            )
            #expect(f.simulator.maxConcurrentStreamsSeen >= 2, "after it, the others went out together")

            // Authenticated: the limit is the simulator's SETTINGS value, and a burst runs in parallel.
            let pool = f.client.pool(
                for: .init(endpoint: APNsEndpoint(host: "localhost", port: f.simulator.port), credential: "default")
            )
            let connection = try await pool.connection()
            #expect(connection.limiter.limit == 500)
            f.simulator.resetStreamHighWater()
            let again = (0..<8).map { _ in Fixture.token() }
            for token in again { f.simulator.script(token, .latency(.milliseconds(300))) }
            let second = await burst(f, again)
            #expect(second.allSatisfy { (try? $0.get().status) == 200 })
            #expect(f.simulator.maxConcurrentStreamsSeen >= 6, "in parallel, not one after another")
            #expect(f.simulator.connectionsAccepted == 1, "every request shared the pool's one connection")
        }
    }

    @Test("a SETTINGS decrease mid-burst is obeyed")
    func settingsDecrease() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            f.simulator.announceMaxConcurrentStreams(2)
            // Let the SETTINGS frame arrive before the burst.
            let pool = f.client.pool(
                for: .init(endpoint: APNsEndpoint(host: "localhost", port: f.simulator.port), credential: "default")
            )
            let connection = try await pool.connection()
            for _ in 0..<200 where connection.limiter.limit != 2 { try await Task.sleep(for: .milliseconds(5)) }
            #expect(connection.limiter.limit == 2)
            // The first request's handler may still be finishing after its 200 was read: count from none.
            for _ in 0..<400 where f.simulator.openStreamCount > 0 { try await Task.sleep(for: .milliseconds(5)) }
            f.simulator.resetStreamHighWater()
            let tokens = (0..<10).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(60))) }
            let results = await burst(f, tokens)
            #expect(results.allSatisfy { (try? $0.get().status) == 200 })
            #expect(f.simulator.maxConcurrentStreamsSeen <= 2)
        }
    }

    @Test("GOAWAY mid-burst: unprocessed requests are resent at once and delivered; none is lost")
    func goAwayMidBurst() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            let tokens = (0..<30).map { _ in Fixture.token() }
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(100))) }
            // The GOAWAY comes once, on the poison's first request, while the burst is in flight.
            let poison = Fixture.token()
            f.simulator.script(poison, .times(1, .goAway))
            // Half the burst first; once it is at the simulator (each waits 100 ms there), the poison and the
            // other half together: what the client opens after the poison is above the GOAWAY's last stream,
            // unprocessed, and resent. (How many is a race with the GOAWAY's arrival; the batch test "a GOAWAY in
            // its middle" has an exact count.)
            let (first, second) = (Array(tokens.prefix(15)), Array(tokens.suffix(15)))
            async let firstHalf = burst(f, first)
            let inFlight = Set(tokens)
            let deadline = ContinuousClock.now + .seconds(30)
            while f.simulator.requests.filter({ inFlight.contains($0.deviceToken ?? "") }).count < 15,
                ContinuousClock.now < deadline
            {
                try await Task.sleep(for: .milliseconds(1))
            }
            async let secondHalf = burst(f, second)
            let poisoned: Result<APNsResponse, any Error>
            do { poisoned = .success(try await f.send(try Fixture.alert(poison))) } catch { poisoned = .failure(error) }
            let others = await firstHalf + secondHalf
            #expect(
                others.allSatisfy { (try? $0.get().status) == 200 },
                "every other request delivered: \(others.compactMap { if case .failure(let e) = $0 { "\(e)" } else { nil } })"
            )
            #expect((try? poisoned.get().status) == 200, "the poison itself was not processed, resent and delivered")
            let attempts = Dictionary(grouping: f.simulator.requests.filter { inFlight.contains($0.deviceToken ?? "") })
            {
                $0.deviceToken ?? ""
            }
            print("GOAWAY mid-burst: \(attempts.values.filter { $0.count > 1 }.count) of 30 resent after the GOAWAY")
            #expect(f.simulator.connectionsAccepted > 1, "a new connection replaced the one that went away")

            // A request that triggers GOAWAY every time is never processed: after its resends (and the
            // reconnect backoff a peer that never lets a request succeed earns) it comes back as not
            // processed or unreachable, which the worker requeues uncounted. (Kept apart from the burst: its
            // resends take down each new connection, and under load the burst's resends with it.)
            let always = Fixture.token()
            f.simulator.script(always, .goAway)
            do {
                let response = try await f.send(try Fixture.alert(always))
                Issue.record("expected a transport error, got \(response.status)")
            } catch let error as TransportError {
                #expect(error.fault == .notProcessed || error.fault == .unreachable, "\(error)")
            }
        }
    }

    @Test("a dropped connection: in-flight requests come back as retryable unknown outcomes; the next send reconnects")
    func droppedConnection() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            let tokens = (0..<10).map { _ in Fixture.token() }
            // Answered after 4.5 s (under the 5 s request deadline): long enough for the drop to come first on a
            // loaded machine.
            for token in tokens { f.simulator.script(token, .latency(.milliseconds(4_500))) }
            let dropper = Fixture.token()
            f.simulator.script(dropper, .dropConnection)
            async let results = burst(f, tokens)
            // Drop only once the whole burst is in flight at the simulator.
            let inFlight = Set(tokens)
            for _ in 0..<800
            where f.simulator.requests.filter({ inFlight.contains($0.deviceToken ?? "") }).count < tokens.count {
                try await Task.sleep(for: .milliseconds(5))
            }
            _ = try? await f.send(try Fixture.alert(dropper))
            let outcomes = await results
            #expect(outcomes.count == 10, "every request returned")
            for outcome in outcomes {
                switch outcome {
                case .success(let response): #expect(response.status == 200)
                case .failure(let error):
                    let transport = try #require(error as? TransportError)
                    #expect(APNsVerdict.classify(status: nil, reason: transport.reason).responseClass == .retryable)
                }
            }
            #expect(
                outcomes.contains { if case .failure = $0 { true } else { false } },
                "the drop cut some in-flight requests"
            )
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            #expect(f.simulator.connectionsAccepted == 2)
        }
    }

    @Test("a reset stream is a retryable transport failure")
    func resetStream() async throws {
        try await Fixture.run { f in
            let token = Fixture.token()
            f.simulator.script(token, .resetStream)
            do {
                _ = try await f.send(try Fixture.alert(token))
                Issue.record("expected a transport error")
            } catch let error as TransportError {
                #expect(error.code == .streamReset || error.code == .connectionReset)
                #expect(APNsVerdict.classify(status: nil, reason: error.reason).responseClass == .retryable)
            }
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
        }
    }
}

@Suite("Connections against a hostile peer")
struct HostilePeerTests {
    @Test(
        "a peer that accepts and at once sends GOAWAY gets reconnect backoff (1 s, then 2 s, on the pool's clock), not a TLS handshake per request; the requests come back not processed"
    )
    func immediateGoAway() async throws {
        // The backoff runs on an injected clock: the test moves time instead of sleeping through it.
        let clock = ManualClock()
        try await Fixture.run(
            simulator: {
                $0.faults.goAwayEvery = 1
                // The peer closes 5 s after its GOAWAY: a close 100 ms after it, while a loaded client had not
                // yet read it, reset the socket and took the GOAWAY with it (an unknown outcome, rightly).
                $0.faults.goAwayGrace = .seconds(5)
            },
            client: {
                $0.clock = clock
                // Not a deadline test: a request timed out on a loaded machine is an unknown outcome.
                $0.requestTimeout = .seconds(60)
            }
        ) { f in
            var faults: [TransportFault] = []
            @Sendable func given(_ count: Int) async -> [TransportFault] {
                var faults: [TransportFault] = []
                for _ in 0..<count {
                    do {
                        _ = try await f.send(try Fixture.alert(Fixture.token()))
                        Issue.record("a request the peer never processes cannot succeed")
                    } catch let error as TransportError {
                        faults.append(error.fault)
                    } catch {
                        Issue.record("not a transport error: \(error)")
                    }
                }
                return faults
            }
            faults += await given(1)
            #expect(f.simulator.connectionsAccepted == 1, "one connect, then the backoff")
            faults += await given(20)
            #expect(f.simulator.connectionsAccepted == 1, "20 sends within the 1 s backoff: no connect")
            clock.advance(by: .seconds(1))
            faults += await given(5)
            #expect(f.simulator.connectionsAccepted == 2, "the backoff over: one connect, and the next backoff")
            clock.advance(by: .seconds(1))
            faults += await given(5)
            #expect(f.simulator.connectionsAccepted == 2, "1 s into a 2 s backoff: no connect")
            clock.advance(by: .seconds(1))
            faults += await given(5)
            #expect(f.simulator.connectionsAccepted == 3, "the doubled backoff over: one connect")
            print(
                "immediate GOAWAY: \(f.simulator.connectionsAccepted) connections for \(faults.count) sends given back (\(Set(faults.map(\.rawValue)).sorted()))"
            )
            #expect(
                faults.allSatisfy { $0 == .notProcessed || $0 == .unreachable },
                "never an unknown outcome: nothing was processed"
            )
        }
    }
}

@Suite("Answers that end early")
struct EarlyEndTests {
    @Test("a :status 200 followed by RST_STREAM before END_STREAM is a delivery, not an unknown outcome to send again")
    func okThenReset() async throws {
        try await Fixture.run(simulator: { $0.faults.okThenResetShare = 1 }) { f in
            for _ in 0..<20 {
                let response = try await f.send(try Fixture.alert(Fixture.token()))
                #expect(response.status == 200)
            }
            #expect(f.simulator.faultCounters.okThenResets == 20, "the simulator reset every 200")
        }
    }
}
