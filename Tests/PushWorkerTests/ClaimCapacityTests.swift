import Foundation
import PushClockTesting
import PushCore
import PushQueueTesting
import Testing

@testable import PushWorker

@Suite("The claimer's capacity and the credential pauses: state machines without a socket or a database")
struct ClaimCapacityTests {
    @Test("whole batches; outcomes not yet written count against capacity; released jobs free it")
    func capacity() {
        var capacity = ClaimCapacity(concurrency: 500, batchSize: 250)
        #expect(capacity.claimLimit() == 250)
        capacity.claimed(Array(1...250))
        #expect(capacity.claimLimit() == 250)
        capacity.claimed(Array(251...400))
        #expect(capacity.claimLimit() == nil, "100 of room is less than half a batch: wait, don't claim crumbs")
        for _ in 0..<400 { capacity.sendFinished() }
        #expect(capacity.inFlight == 0)
        #expect(capacity.claimLimit() == nil, "sends finished but 400 outcomes unwritten: still no room")
        capacity.released(Array(1...300))
        #expect(capacity.claimLimit() == 250)
        #expect(capacity.held == Set(301...400))
    }

    @Test("concurrency 1: one at a time, never a claim of zero")
    func single() {
        var capacity = ClaimCapacity(concurrency: 1, batchSize: 250)
        #expect(capacity.claimLimit() == 1)
        capacity.claimed([7])
        #expect(capacity.claimLimit() == nil)
        capacity.sendFinished()
        #expect(capacity.claimLimit() == nil)
        capacity.released([7])
        #expect(capacity.claimLimit() == 1)
    }

    @Test(
        "a fan-out's children held at once go out as room comes free: sends started never exceed the concurrency, and the claimer waits for them"
    )
    func deferredChildren() {
        var capacity = ClaimCapacity(concurrency: 10, batchSize: 4)
        capacity.claimed([1, 2, 3, 4, 5, 6])
        capacity.claimedDeferred(Array(100..<120))
        #expect(capacity.claimLimit() == nil, "26 held against 10: no claim")
        #expect(capacity.startDeferred(upTo: 20) == 4, "6 sending: room for 4")
        #expect(capacity.startDeferred(upTo: 16) == 0)
        capacity.sendFinished()
        capacity.sendFinished()
        #expect(capacity.startDeferred(upTo: 16) == 2)
        for _ in 0..<8 { capacity.sendFinished() }
        #expect(capacity.startDeferred(upTo: 14) == 8, "2 sending: room for 8")
        #expect(capacity.startDeferred(upTo: 6) == 0 && capacity.deferred == 6)
        for _ in 0..<10 { capacity.sendFinished() }
        #expect(capacity.startDeferred(upTo: 6) == 6 && capacity.deferred == 0)
        for _ in 0..<6 { capacity.sendFinished() }
        capacity.released([1, 2, 3, 4, 5, 6] + Array(100..<120))
        #expect(capacity.inFlight == 0 && capacity.claimLimit() == 4)
        // Children never sent (the worker stops): no longer counted nor held.
        capacity.claimedDeferred([200, 201, 202])
        #expect(capacity.startDeferred(upTo: 1) == 1)
        capacity.abandonDeferred([201, 202])
        #expect(capacity.deferred == 0 && capacity.inFlight == 1 && capacity.held == [200])
    }

    @Test("pauses double up to the cap, end by themselves, and a success ends the streak (on the injected clock)")
    func pauses() {
        let clock = ManualClock()
        let pauses = Pauses<String>(initial: .seconds(30), maximum: .seconds(100), clock: clock)
        let first = pauses.pause("a")
        #expect(first.isNew && first.length == .seconds(30))
        clock.advance(by: .seconds(10))
        let again = pauses.pause("a")
        #expect(!again.isNew && again.length == .seconds(20), "already paused, 20 s left")
        clock.advance(by: .seconds(19))
        #expect(pauses.active() == ["a"] && pauses.isPaused("a"))
        clock.advance(by: .seconds(2))
        #expect(pauses.active().isEmpty && !pauses.isPaused("a"), "the pause ends by itself")
        #expect(pauses.pause("a").length == .seconds(60), "doubled")
        clock.advance(by: .seconds(169))
        #expect(pauses.pause("a").length == .seconds(100), "capped at the maximum")
        pauses.succeeded("a")
        clock.advance(by: .seconds(200))
        #expect(pauses.pause("a").length == .seconds(30), "a success ends the streak")
        let topics = Pauses<TopicKey>(initial: .seconds(1), maximum: .seconds(2), clock: clock)
        _ = topics.pause(TopicKey(credential: "c", topic: "t"))
        #expect(topics.active().map(\.description) == ["c/t"], "the claim's text")
        #expect(!topics.isPaused(TopicKey(credential: "c", topic: "u")))
    }
}
