import Foundation
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

    @Test("credential pauses double up to the cap, end by themselves, and a success ends the streak (clock passed in)")
    func pauses() {
        let pauses = CredentialPauses(initial: .seconds(30), maximum: .seconds(100))
        let start = Date(timeIntervalSince1970: 1_000_000)
        let first = pauses.pause("a", now: start)
        #expect(first.isNew && first.until == start.addingTimeInterval(30))
        #expect(pauses.pause("a", now: start.addingTimeInterval(10)).isNew == false, "already paused")
        #expect(pauses.active(now: start.addingTimeInterval(29)) == ["a"])
        #expect(pauses.active(now: start.addingTimeInterval(31)).isEmpty, "the pause ends by itself")
        let second = pauses.pause("a", now: start.addingTimeInterval(31))
        #expect(second.until == start.addingTimeInterval(31 + 60), "doubled")
        let third = pauses.pause("a", now: start.addingTimeInterval(200))
        #expect(third.until == start.addingTimeInterval(300), "capped at the maximum")
        pauses.succeeded("a")
        #expect(
            pauses.pause("a", now: start.addingTimeInterval(400)).until == start.addingTimeInterval(430),
            "a success ends the streak"
        )
    }
}
