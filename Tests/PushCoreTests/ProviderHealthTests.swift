import PushCore
import Testing

/// "Provider outages burn nothing": the window's rule (more than half of at least 20 answers within 10 s are
/// 5xx, across distinct jobs), one probe at a time backing off from 1 s to 30 s, and what brings it back up.
struct ProviderHealthTests {
    let start = ContinuousClock.now

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { self.start + .milliseconds(milliseconds) }

    @Test("20 answers, 11 of them 5xx from distinct jobs: down; 19, or 10 of 20, or one job's own 5xx: not")
    func window() {
        var health = ProviderHealth()
        for job in 0..<9 {
            let r = health.record(serverError: false, job: Int64(job), at: self.at(job))
            #expect(r == nil)
        }
        // One job's 5xx again and again counts once.
        for _ in 0..<30 {
            let r = health.record(serverError: true, job: 100, at: self.at(50))
            #expect(r == nil)
        }
        for job in 101..<110 {
            let r = health.record(serverError: true, job: Int64(job), at: self.at(60))
            #expect(r == nil)
        }
        #expect(!health.isDown, "19 answers, 10 of them 5xx")
        let change = health.record(serverError: true, job: 110, at: self.at(70))
        #expect(change == .down(serverErrors: 11, answers: 20))
        #expect(health.isDown)

        // A brownout under half: never down.
        var brownout = ProviderHealth()
        var job: Int64 = 0
        for second in 0..<30 {
            for n in 0..<10 {
                job += 1
                let error = n < 4
                _ = brownout.record(
                    serverError: error,
                    job: job,
                    at: self.at(second * 1000 + n)
                )
            }
        }
        #expect(!brownout.isDown, "40 % 5xx is the jobs' own retries, not an outage")
    }

    @Test("answers older than the window are forgotten: 15 5xx, 11 s of quiet, 6 more 5xx is no outage")
    func forgets() {
        var health = ProviderHealth()
        for job in 0..<15 { _ = health.record(serverError: true, job: Int64(job), at: self.at(0)) }
        for job in 15..<21 { _ = health.record(serverError: true, job: Int64(job), at: self.at(11_000)) }
        #expect(!health.isDown)
    }

    /// A provider taken for down at `at(0)`.
    func down() -> ProviderHealth {
        var health = ProviderHealth()
        for job in 0..<20 { _ = health.record(serverError: true, job: Int64(job), at: self.at(0)) }
        return health
    }

    @Test("down: no request until the probe is due, then one; a 5xx probe doubles the wait up to 30 s")
    func probes() {
        var health = self.down()
        #expect(health.isDown)
        let r1 = health.admits(job: 1_000, at: self.at(500))
        #expect(!r1, "the first probe waits 1 s")
        #expect(!health.probeDue(at: self.at(999)))
        #expect(health.probeDue(at: self.at(1_000)))
        let r2 = health.admits(job: 1_000, at: self.at(1_000))
        #expect(r2)
        let r3 = health.admits(job: 1_000, at: self.at(1_001))
        #expect(r3, "the probe itself, asked again")
        let r4 = health.admits(job: 1_001, at: self.at(1_001))
        #expect(!r4, "one probe at a time")
        #expect(!health.probeDue(at: self.at(5_000)), "not while the probe is out")
        // Answers of requests written before the outage was seen decide nothing, unless a 2xx.
        let r5 = health.record(serverError: false, job: 7, at: self.at(1_100))
        #expect(r5 == nil)
        #expect(health.isDown)
        var now = 1_200
        var waits: [Int] = []
        for _ in 0..<7 {
            let r6 = health.record(serverError: true, job: 1_000, at: self.at(now))
            #expect(r6 == nil)
            var next = now + 1
            while !health.probeDue(at: self.at(next)) { next += 250 }
            waits.append((next - now + 249) / 1_000)
            now = next
            let r7 = health.admits(job: 1_000, at: self.at(now))
            #expect(r7)
        }
        #expect(waits == [2, 4, 8, 16, 30, 30, 30], "\(waits)")
        // A probe that ends unanswered makes way for the next after the same wait.
        health.probeEnded(job: 1_000, at: self.at(now))
        #expect(!health.probeDue(at: self.at(now + 29_000)) && health.probeDue(at: self.at(now + 30_000)))
    }

    @Test(
        "down: the probe's answer that is not a 5xx brings it up, and the window starts afresh; other answers decide nothing"
    )
    func recovers() {
        var probed = self.down()
        let r8 = probed.admits(job: 500, at: self.at(1_000))
        #expect(r8)
        let r9 = probed.record(serverError: false, job: 500, at: self.at(1_500))
        #expect(r9 == .up(after: .milliseconds(1_500)))
        #expect(!probed.isDown)
        let r10 = probed.admits(job: 501, at: self.at(1_500))
        #expect(r10)
        // The 5xx before it are forgotten: one more is not an outage.
        let r12 = probed.record(serverError: true, job: 99, at: self.at(1_600))
        #expect(r12 == nil && !probed.isDown)
        // But until 20 answers are counted again it may be down: a job's last 5xx just after the probe's 200 (a
        // brownout flapping down and up) is sent back uncounted, not dead-lettered as its own failure.
        #expect(probed.mayBeDown(at: self.at(1_601), since: self.at(1_550)))
        for job in 600..<619 { _ = probed.record(serverError: false, job: Int64(job), at: self.at(1_700)) }
        #expect(!probed.mayBeDown(at: self.at(1_701), since: self.at(1_550)), "20 answers since, one a 5xx")
        // A quiet scope: recovering ends a minute after the provider came back, however few answers came.
        var quiet = self.down()
        _ = quiet.admits(job: 500, at: self.at(1_000))
        _ = quiet.record(serverError: false, job: 500, at: self.at(1_500))
        for job in 600..<605 { _ = quiet.record(serverError: false, job: Int64(job), at: self.at(50_000)) }
        _ = quiet.record(serverError: true, job: 99, at: self.at(51_000))
        #expect(quiet.mayBeDown(at: self.at(51_001), since: self.at(50_500)), "6 answers since it came back")
        for job in 700..<705 { _ = quiet.record(serverError: false, job: Int64(job), at: self.at(61_700)) }
        _ = quiet.record(serverError: true, job: 98, at: self.at(62_000))
        #expect(!quiet.mayBeDown(at: self.at(62_001), since: self.at(61_600)), "back for a minute: one job's own")
        // An answer to a request written before the outage was seen decides nothing, a 200 included: a frozen
        // worker's late answers must not reopen the gates while the provider is still down.
        var late = self.down()
        let r11 = late.record(serverError: false, job: 3, at: self.at(300))
        #expect(r11 == nil && late.isDown)
    }

    @Test(
        "maybe down: a quarter of the last 20 answers 5xx, or nothing but 5xx for 10 s (too few jobs to judge); not when the provider answers"
    )
    func mayBeDown() {
        var health = ProviderHealth()
        #expect(health.mayBeDown(at: self.at(0)), "nothing answered yet")
        for job in 0..<16 { _ = health.record(serverError: false, job: Int64(job), at: self.at(job)) }
        for job in 16..<20 { _ = health.record(serverError: true, job: Int64(job), at: self.at(job)) }
        #expect(!health.mayBeDown(at: self.at(20)), "4 of 20, the provider answering")
        _ = health.record(serverError: true, job: 20, at: self.at(20))
        #expect(health.mayBeDown(at: self.at(21)) && !health.isDown, "5 of the last 20")
        for job in 21..<41 { _ = health.record(serverError: false, job: Int64(job), at: self.at(job)) }
        #expect(!health.mayBeDown(at: self.at(41)), "answered again")
        // A quiet queue: one job's 5xx again and again, nothing else answered for 10 s.
        _ = health.record(serverError: true, job: 99, at: self.at(5_000))
        #expect(!health.mayBeDown(at: self.at(5_000)))
        _ = health.record(serverError: true, job: 99, at: self.at(10_040))
        #expect(health.mayBeDown(at: self.at(10_041)), "no answer but 5xx for a window")
        // Known since when the job was due again: a request written since then answered other than 5xx (the
        // provider works: the job's own failure); or none (maybe down, however few jobs failed: at an outage's
        // onset each worker may see a job's 5xx once, and a quiet queue has too few jobs to judge by).
        var quiet = ProviderHealth()
        for job in 0..<20 { _ = quiet.record(serverError: false, job: Int64(job), at: self.at(job)) }
        _ = quiet.record(serverError: true, job: 99, at: self.at(5_000))
        _ = quiet.record(serverError: true, job: 99, at: self.at(8_000))
        #expect(!quiet.mayBeDown(at: self.at(8_001), since: self.at(10)), "answered since it was due")
        // Before: one or two jobs failing just after others were answered were taken for their own failures, and
        // a job whose three 5xx came from three workers at an outage's onset was dead-lettered.
        #expect(quiet.mayBeDown(at: self.at(8_001), since: self.at(50)), "one job, nothing answered since it was due")
        _ = quiet.record(serverError: false, job: 100, at: self.at(8_050), written: self.at(8_040))
        #expect(!quiet.mayBeDown(at: self.at(8_051), since: self.at(50)), "a request written since was answered")
        // A quiet queue: a job's previous 503 at 0, another job answered 200 at 30 s, the provider down from
        // 40 s, the job's last 503 at 60 s. The 200 came after the job's previous attempt, but nothing has been
        // heard for 30 s: maybe down (a reviewer's case; the job would have been dead-lettered).
        var sparse = ProviderHealth()
        _ = sparse.record(serverError: false, job: 1, at: self.at(30_000), written: self.at(29_990))
        _ = sparse.record(serverError: true, job: 2, at: self.at(60_000))
        #expect(sparse.mayBeDown(at: self.at(60_001), since: self.at(0)), "nothing heard for 30 s")
        #expect(!sparse.mayBeDown(at: self.at(35_001), since: self.at(0)), "5 s after the 200: the job's own")
        // Sent back once for that doubt, the job is judged by what was answered since its previous attempt: a
        // quiet queue's own failure is not doubted for an hour.
        #expect(!sparse.mayBeDown(at: self.at(60_001), since: self.at(0), afterDoubt: true), "answered since")
        #expect(sparse.mayBeDown(at: self.at(60_001), since: self.at(40_000), afterDoubt: true), "not since")
        var thawed = ProviderHealth()
        _ = thawed.record(serverError: false, job: 1, at: self.at(0))
        _ = thawed.record(serverError: true, job: 2, at: self.at(12_000))
        #expect(thawed.mayBeDown(at: self.at(12_001), since: self.at(11_000)), "nothing else heard for a window")
    }

    @Test(
        "at an outage's onset, 200s to requests written before it vouch for nothing: a job's last 5xx after them is a maybe-down, not its own failure"
    )
    func answersWrittenBeforeTheOnset() {
        var health = ProviderHealth()
        // A busy connection: requests written up to t=500 ms, answered 200 until t=1,020 ms.
        for job in 0..<20 {
            _ = health.record(serverError: false, job: Int64(job), at: self.at(1_000 + job), written: self.at(500))
        }
        // The outage began at t=550: three jobs met a 5xx; job 99 was due again at 700 and met its last one.
        for job in [97, 98, 99] as [Int64] { _ = health.record(serverError: true, job: job, at: self.at(600)) }
        _ = health.record(serverError: true, job: 99, at: self.at(1_050))
        // Before: the 200s answered at 1,000-1,019 counted as "answered since the job was due" (its own failure).
        #expect(health.mayBeDown(at: self.at(1_051), since: self.at(700)), "nothing written since 700 was answered")
        // A request written after the job was due and answered 200: the provider works, the 5xx is the job's.
        _ = health.record(serverError: false, job: 200, at: self.at(1_060), written: self.at(800))
        #expect(!health.mayBeDown(at: self.at(1_061), since: self.at(700)))
    }

    @Test(
        "a first wave of 20 while the provider is not heard from lately (never, 2 s of quiet, answers read late, just back up); none while it answers or is down"
    )
    func firstWave() {
        var health = ProviderHealth()
        #expect(health.firstWave(at: self.at(0)) == 20, "never heard from")
        _ = health.record(serverError: false, job: 1, at: self.at(100))
        #expect(health.firstWave(at: self.at(150)) == nil, "answered 50 ms ago")
        #expect(health.firstWave(at: self.at(2_099)) == nil)
        #expect(health.firstWave(at: self.at(2_100)) == 20, "2 s of quiet")
        // A 5xx is not hearing from it.
        _ = health.record(serverError: true, job: 2, at: self.at(2_200))
        #expect(health.firstWave(at: self.at(2_300)) == 20)
        // An answer read late to a request written long ago still counts the instant it was read (the caller
        // leaves out those read more than 5 s after their write: ``ProviderOutages``).
        _ = health.record(serverError: false, job: 3, at: self.at(2_400), written: self.at(1_000))
        #expect(health.firstWave(at: self.at(2_500)) == nil)

        // The wave is shared: what one batch took and has not ended is not given to the next.
        var shared = ProviderHealth()
        #expect(shared.takeWave(15, at: self.at(0)) == 15)
        #expect(shared.takeWave(15, at: self.at(1)) == 5)
        #expect(shared.takeWave(15, at: self.at(2)) == 0)
        shared.waveEnded(15)
        #expect(shared.takeWave(30, at: self.at(3)) == 15)
        _ = shared.record(serverError: false, job: 1, at: self.at(4))
        #expect(shared.takeWave(30, at: self.at(5)) == nil, "heard from: no wave")

        // Down: only the probe goes (``admits(job:at:)``), no wave. Back up: waves until 20 answers are counted.
        var down = ProviderHealth()
        for job in 0..<20 { _ = down.record(serverError: true, job: Int64(job), at: self.at(job)) }
        #expect(down.isDown)
        #expect(down.firstWave(at: self.at(100)) == nil)
        let probe = down.admits(job: 50, at: self.at(1_100))
        let up = down.record(serverError: false, job: 50, at: self.at(1_150))
        #expect(probe && up == .up(after: .milliseconds(1_131)))
        for job in 51..<71 {
            #expect(down.firstWave(at: self.at(1_200)) == 20, "back up, \(job - 51) answers since")
            _ = down.record(serverError: false, job: Int64(job), at: self.at(1_200))
        }
        #expect(down.firstWave(at: self.at(1_200)) == nil, "20 answers since it came back")
    }

    @Test("a busy drain's successes do not outvote an outage that began this second")
    func outageDuringABusyDrain() {
        var health = ProviderHealth()
        var job: Int64 = 0
        // Nine seconds of 1,000 successes a second, then every answer a 5xx.
        for millisecond in stride(from: 0, to: 9_000, by: 1) {
            job += 1
            _ = health.record(serverError: false, job: job, at: self.at(millisecond))
        }
        var failures = 0
        while !health.isDown {
            job += 1
            failures += 1
            _ = health.record(serverError: true, job: job, at: self.at(9_000 + failures))
        }
        #expect(failures <= 21, "down after \(failures) 5xx answers")
    }

    @Test("AnswerWindow: a bad answer tips it only with at least 20 answers in 10 s, more than half bad")
    func answerWindow() {
        var window = AnswerWindow()
        for job in 0..<10 {
            let r = window.record(bad: false, job: Int64(job), at: self.at(0))
            #expect(r == nil)
        }
        for job in 10..<20 {
            let r = window.record(bad: true, job: Int64(job), at: self.at(0))
            #expect(r == nil)
        }
        let r13 = window.record(bad: true, job: 20, at: self.at(0))
        #expect(r13.map { [$0.bad, $0.answers] } == [11, 20])
    }
}
