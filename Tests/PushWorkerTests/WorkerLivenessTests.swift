import Testing

@testable import PushWorker

@Suite("Worker liveness: fresh heartbeat, cut off, may reap (time passed in)")
struct WorkerLivenessTests {
    let t0 = ContinuousClock.now
    func liveness() -> WorkerLiveness {
        WorkerLiveness(staleAfter: .seconds(30), heartbeatInterval: .seconds(5), reconnectGrace: .seconds(75))
    }

    @Test(
        "no send before the first heartbeat; fresh until half an interval before stale; the first reap waits a stale period"
    )
    func firstHeartbeat() {
        var l = self.liveness()
        #expect(!l.isFresh(at: self.t0) && !l.mayReap(at: self.t0))
        l.heartbeatSucceeded(at: self.t0)
        #expect(l.isFresh(at: self.t0 + .milliseconds(27_499)))
        #expect(!l.isFresh(at: self.t0 + .milliseconds(27_500)), "stale minus half an interval: sends stop")
        #expect(!l.mayReap(at: self.t0 + .seconds(29)))
        #expect(l.mayReap(at: self.t0 + .seconds(30)), "others had a whole stale period to check in")
        l.heartbeatSucceeded(at: self.t0 + .seconds(5))
        #expect(l.mayReap(at: self.t0 + .seconds(30)), "a regular heartbeat does not move the reap time")
    }

    @Test("a lost connection: no reaping until a heartbeat gets through and the reconnect grace has passed")
    func cutOff() {
        var l = self.liveness()
        l.heartbeatSucceeded(at: self.t0)
        l.heartbeatFailed(connectionLost: true)
        #expect(!l.mayReap(at: self.t0 + .seconds(100)) && l.cutOff)
        l.heartbeatSucceeded(at: self.t0 + .seconds(40))
        #expect(!l.cutOff && l.isFresh(at: self.t0 + .seconds(40)))
        #expect(!l.mayReap(at: self.t0 + .seconds(114)))
        #expect(l.mayReap(at: self.t0 + .seconds(115)), "the grace counts from the heartbeat that got through")
    }

    @Test("a refused statement is no outage; a heartbeat that took longer than stale to get through is")
    func refusedAndSlow() {
        var l = self.liveness()
        l.heartbeatSucceeded(at: self.t0)
        l.heartbeatFailed(connectionLost: false)
        #expect(!l.cutOff && l.mayReap(at: self.t0 + .seconds(30)))
        // The next heartbeat got through 31 s after the last: the pool was queueing (a failover).
        l.heartbeatSucceeded(at: self.t0 + .seconds(31))
        #expect(!l.mayReap(at: self.t0 + .seconds(105)))
        #expect(l.mayReap(at: self.t0 + .seconds(106)))
    }
}
