import PushCore

/// When a worker's claimed jobs go out: at once, or at the send time their rate limit's fleet-wide schedule
/// gave them, spaced in this worker (``SendSpacer``) and no later than a tolerance after it. It decides times
/// only; the worker sends what it hands over.
struct SendScheduler: Sendable {
    /// How late after its slot a rate-limited request may still be written. Later, it is withdrawn
    /// (released uncounted, claimed again for a new slot): sent late, it would leave together with the
    /// requests other workers send on time, and the fleet's rate would not hold where the requests leave.
    static let lateSendTolerance = Duration.milliseconds(150)

    let clock: any PushClock
    let spacer = SendSpacer()
    let metrics: WorkerMetrics

    /// A claimed batch split into the jobs to send now and those to send at their rate limit's slot.
    func split(_ jobs: [PushJob]) -> (due: [PushJob], scheduled: [ScheduledSend]) {
        var due: [PushJob] = []
        var scheduled: [ScheduledSend] = []
        let now = self.clock.now
        for job in jobs {
            // A rate-limited job waits for the send time its limit's fleet-wide schedule gave it: an
            // offset from when the schedule was read, some time during this claim. Counted from now
            // (the claim's answer), it is never early; it must leave within the tolerance of that
            // slot, or it is withdrawn: a busy worker or a request waiting for a stream would
            // otherwise send it on top of other workers' later slots. (Counted from the claim's start
            // instead, a claim slower than the tolerance, a database across a region, would withdraw
            // every limited job it took, for ever.)
            let slot = job.sendAt.map { sendAt in
                now + .milliseconds(Int64(sendAt.timeIntervalSince(job.claimedAt ?? sendAt) * 1000))
            }
            // Limited jobs are always scheduled: their sends are spaced here too.
            guard let slot, slot > now || job.sendSpacing != nil else {
                due.append(job)
                continue
            }
            scheduled.append(
                ScheduledSend(
                    job: job,
                    slot: slot,
                    latest: job.sendSpacing == nil ? nil : slot + Self.lateSendTolerance
                )
            )
        }
        return (due, scheduled)
    }

    /// Hands `jobs` to `send` as batches as their times come: every job whose time has come goes in the next
    /// batch. A rate-limited job also takes its limit's next free slot in this worker
    /// (``SendSpacer/slot(for:notBefore:)``); one whose slot is later waits for it. Each batch is sent in a
    /// task of its own: the next time comes whether or not the last batch's answers have.
    func send(_ jobs: [ScheduledSend], _ send: @escaping @Sendable ([ScheduledSend]) async -> Void) async {
        await withDiscardingTaskGroup { batches in
            var waiting = jobs.sorted { $0.slot < $1.slot }
            while let first = waiting.first {
                // A cancelled wait (a drain past its grace) goes on at once: the writes are then withdrawn.
                try? await self.clock.sleep(until: first.slot, tolerance: nil)
                var ready: [ScheduledSend] = []
                var later: [ScheduledSend] = []
                let now = self.clock.now
                while let next = waiting.first, next.slot <= now {
                    waiting.removeFirst()
                    if let spacing = next.job.sendSpacing, !next.spaced {
                        let spaced = self.spacer.slot(for: spacing, notBefore: now)
                        if spaced > now {
                            later.append(ScheduledSend(job: next.job, slot: spaced, latest: next.latest, spaced: true))
                            continue
                        }
                    }
                    ready.append(next)
                }
                if !later.isEmpty { waiting = (waiting + later).sorted { $0.slot < $1.slot } }
                if !ready.isEmpty {
                    let batch = ready
                    batches.addTask { await send(batch) }
                }
            }
        }
    }

    /// Whether a rate-limited request is held back just before its write: it is later than `latest` (sent
    /// late, it would leave together with the requests other workers send on time) or within an interval of
    /// this worker's last request of its limit (``SendSpacer/admit(_:now:)``, which records the write when it
    /// is admitted).
    func holdsBack(_ job: PushJob, latest: ContinuousClock.Instant?) -> Bool {
        let now = self.clock.now
        if let latest, now > latest {
            self.metrics.lateLimitedSend()
            return true
        }
        return job.sendSpacing.map { !self.spacer.admit($0, now: now) } ?? false
    }
}

/// A claimed job whose send time is later than the claim: its slot, and for a rate-limited one the latest it
/// may still be written.
struct ScheduledSend: Sendable {
    let job: PushJob
    let slot: ContinuousClock.Instant
    let latest: ContinuousClock.Instant?
    /// The limit's spacing gave it this slot already.
    var spaced = false
}
