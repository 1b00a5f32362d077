import Foundation
import PushClockTesting
import PushCore
import Synchronization
import Testing

@testable import PushWorker

/// When claimed jobs go out, on a clock the test moves: now, at their limit's slot, spaced per limit, and held
/// back when late or too close to the limit's last request. No socket, no database, no sleep.
@Suite("The send scheduler on a manual clock")
struct SendSchedulerTests {
    static let claimedAt = Date(timeIntervalSince1970: 1_800_000_000)

    static func job(_ id: Int64, sendIn: Double? = nil, spacing: SendSpacing? = nil) -> PushJob {
        var job = PushJob(
            id: id,
            apnsID: UUID(),
            topic: "com.example.app",
            deviceToken: String(repeating: "ab", count: 32),
            payload: #"{"aps":{}}"#,
            runAt: Self.claimedAt,
            createdAt: Self.claimedAt,
            claimedAt: Self.claimedAt
        )
        job.sendAt = sendIn.map { Self.claimedAt.addingTimeInterval($0) }
        job.sendSpacing = spacing
        return job
    }

    @Test(
        "a job without a send time is due now; a later one waits for its slot; a limited one is always scheduled, with a late tolerance"
    )
    func split() {
        let clock = ManualClock()
        let scheduler = SendScheduler(clock: clock, metrics: WorkerMetrics())
        let spacing = SendSpacing(scope: 1, interval: 0.1)
        let (due, scheduled) = scheduler.split([
            Self.job(1), Self.job(2, sendIn: 2), Self.job(3, sendIn: 0, spacing: spacing),
        ])
        #expect(due.map(\.id) == [1])
        let byID = Dictionary(uniqueKeysWithValues: scheduled.map { ($0.job.id, $0) })
        #expect(byID[2]?.slot == clock.now + .seconds(2) && byID[2]?.latest == nil)
        #expect(byID[3]?.slot == clock.now && byID[3]?.latest == clock.now + SendScheduler.lateSendTolerance)
    }

    @Test("scheduled jobs are handed over as their times come, those of one time together, a limit's spaced apart")
    func batchesAsTimesCome() async throws {
        let clock = ManualClock()
        let scheduler = SendScheduler(clock: clock, metrics: WorkerMetrics())
        let spacing = SendSpacing(scope: 7, interval: 0.5)
        let (_, scheduled) = scheduler.split([
            Self.job(1, sendIn: 1), Self.job(2, sendIn: 1), Self.job(3, sendIn: 3),
            Self.job(4, sendIn: 1, spacing: spacing), Self.job(5, sendIn: 1, spacing: spacing),
        ])
        let handed = Mutex<[[Int64]]>([])
        let sending = Task {
            await scheduler.send(scheduled) { batch in handed.withLock { $0.append(batch.map(\.job.id).sorted()) } }
        }
        // Asleep until the first slot: nothing handed over before the clock moves.
        #expect(await clock.waitForSleepers(1))
        #expect(handed.withLock { $0 }.isEmpty)
        clock.advance(by: .seconds(1))
        // At 1 s: jobs 1, 2 and the limit's first (4); its second (5) is spaced half a second later.
        #expect(await clock.waitForSleepers(1))
        try await Self.eventually { handed.withLock { $0.flatMap { $0 } }.count == 3 }
        #expect(Set(handed.withLock { $0 }.flatMap { $0 }) == [1, 2, 4])
        clock.advance(by: .milliseconds(500))
        #expect(await clock.waitForSleepers(1))
        try await Self.eventually { handed.withLock { $0.flatMap { $0 } }.contains(5) }
        clock.advance(by: .seconds(2))
        await sending.value
        #expect(handed.withLock { $0 }.last == [3])
    }

    @Test(
        "a limited request is held back past its latest time (counted) and within its limit's interval of the last one"
    )
    func holdsBack() {
        let clock = ManualClock()
        let scheduler = SendScheduler(clock: clock, metrics: WorkerMetrics())
        let spacing = SendSpacing(scope: 9, interval: 1)
        let limited = Self.job(1, spacing: spacing)
        #expect(!scheduler.holdsBack(limited, latest: clock.now + .milliseconds(150)), "on time: admitted")
        #expect(scheduler.holdsBack(Self.job(2, spacing: spacing), latest: nil), "an interval has not passed")
        clock.advance(by: .seconds(1))
        #expect(!scheduler.holdsBack(Self.job(3, spacing: spacing), latest: nil))
        #expect(scheduler.holdsBack(Self.job(4), latest: clock.now - .milliseconds(1)), "late")
        #expect(!scheduler.holdsBack(Self.job(5), latest: nil), "not limited, not late")
    }

    /// Polls (every millisecond, 10 s at most) for what another task hands over after a clock move.
    static func eventually(_ condition: @Sendable () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while !condition() && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
        #expect(condition())
    }
}
