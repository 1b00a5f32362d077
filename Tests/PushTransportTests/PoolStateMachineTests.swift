import Testing

@testable import PushTransport

/// The pool's and the stream limiter's state machines, driven by events and an instant passed in: no
/// socket, no sleep.
@Suite("Connection pool and stream limiter state machines")
struct PoolStateMachineTests {
    final class Fake: PoolConnection {
        var isUsable = true
        var freeStreams = 10
    }

    let t0 = ContinuousClock.now

    @Test("opens empty slots first, then uses the connection with the most free streams, round-robin when all are full")
    func choose() throws {
        var pool = PoolStateMachine<Fake>(size: 2, initialBackoff: .seconds(1), maximumBackoff: .seconds(60))
        guard case .open(let slotA, let idA) = pool.next(now: t0).action else {
            Issue.record("open first")
            return
        }
        guard case .open(let slotB, let idB) = pool.next(now: t0).action else {
            Issue.record("open the second slot")
            return
        }
        #expect(slotA != slotB && idA != idB)
        guard case .wait = pool.next(now: t0).action else {
            Issue.record("both connecting: wait")
            return
        }
        let a = Fake()
        let b = Fake()
        a.freeStreams = 3
        b.freeStreams = 7
        pool.connected(a, slot: slotA)
        pool.connected(b, slot: slotB)
        guard case .use(let best) = pool.next(now: t0).action else {
            Issue.record("use")
            return
        }
        #expect(best === b)
        a.freeStreams = 0
        b.freeStreams = 0
        var seen: Set<ObjectIdentifier> = []
        for _ in 0..<4 { if case .use(let c) = pool.next(now: t0).action { seen.insert(ObjectIdentifier(c)) } }
        #expect(seen.count == 2, "full connections are shared round-robin")
    }

    @Test(
        "a failed connect backs off 1 s, 2 s, 4 s … to the cap; while backing off with nothing open the endpoint is unreachable"
    )
    func connectBackoff() {
        var pool = PoolStateMachine<Fake>(size: 1, initialBackoff: .seconds(1), maximumBackoff: .seconds(4))
        var now = t0
        for expected in [1, 2, 4, 4] {
            guard case .open(let slot, _) = pool.next(now: now).action else {
                Issue.record("open")
                return
            }
            #expect(pool.connectFailed(slot: slot, now: now) == .seconds(Int64(expected)))
            guard case .unreachable(let until) = pool.next(now: now + .milliseconds(500)).action else {
                Issue.record("unreachable")
                return
            }
            #expect(until == now + .seconds(Int64(expected)))
            now = until
        }
    }

    @Test(
        "connections that die before any answer earn backoff; an answer resets it; swept connections are handed back to close"
    )
    func deathBeforeAnswer() {
        var pool = PoolStateMachine<Fake>(size: 1, initialBackoff: .seconds(1), maximumBackoff: .seconds(60))
        guard case .open(let slot, _) = pool.next(now: t0).action else { return }
        let first = Fake()
        pool.connected(first, slot: slot)
        first.isUsable = false  // GOAWAY at once, before any answer
        let (action, swept) = pool.next(now: t0)
        #expect(swept.count == 1 && swept[0] === first, "the pool hands it back to be closed")
        guard case .unreachable = action else {
            Issue.record("backoff after a connection that never answered: \(action)")
            return
        }
        // After the backoff: reconnect; this one answers, so a later GOAWAY costs no backoff.
        guard case .open(let again, _) = pool.next(now: t0 + .seconds(1)).action else {
            Issue.record("reconnect")
            return
        }
        let second = Fake()
        pool.connected(second, slot: again)
        pool.answered()
        second.isUsable = false
        guard case .open = pool.next(now: t0 + .seconds(1)).action else {
            Issue.record("an answered connection is replaced at once")
            return
        }
    }

    @Test(
        "the stream limiter: 1 until authenticated, then the peer's SETTINGS; decreases obeyed; close wakes waiters with false"
    )
    func limiter() async {
        let limiter = StreamLimiter()
        limiter.updatePeerMaxStreams(100)
        #expect(limiter.limit == 1, "one stream until a request with a valid token succeeds")
        #expect(await limiter.acquire())
        limiter.markAuthenticated()
        #expect(limiter.limit == 100 && limiter.available == 99)
        limiter.updatePeerMaxStreams(1)
        #expect(limiter.available == 0, "a decrease applies at once")
        async let waiter = limiter.acquire()
        limiter.close()
        #expect(await waiter == false, "a closed connection refuses its waiters")
        #expect(await limiter.acquire() == false)
        limiter.markUnauthenticated()
        #expect(limiter.limit == 1)
    }

    @Test("batch grants: as many slots as are free, at most the count asked; waiters in turn get what a release frees")
    func limiterBatches() async {
        let limiter = StreamLimiter()
        limiter.updatePeerMaxStreams(10)
        #expect(await limiter.acquire(upTo: 5) == 1, "unauthenticated: one stream")
        limiter.markAuthenticated()
        #expect(await limiter.acquire(upTo: 4) == 4)
        #expect(await limiter.acquire(upTo: 50) == 5, "what is free, not what was asked")
        #expect(limiter.available == 0)
        async let first = limiter.acquire(upTo: 3)
        while limiter.waiting < 1 { try? await Task.sleep(for: .milliseconds(1)) }
        async let second = limiter.acquire(upTo: 3)
        while limiter.waiting < 2 { try? await Task.sleep(for: .milliseconds(1)) }
        limiter.release(4)
        #expect(await first == 3, "the first waiter takes up to its count")
        #expect(await second == 1, "the next one what is left")
        limiter.release(0)
        #expect(limiter.inFlight == 10)
        limiter.close()
        #expect(await limiter.acquire(upTo: 3) == 0)
    }
}
