/// How many jobs the claimer may take now: a plain state machine under the service's lock.
///
/// A job counts from its claim until its outcome is written (not only while it is sent): a worker that
/// cannot write outcomes stops claiming instead of piling up jobs it holds. Claims come in whole batches
/// where possible: below half a batch of room the claimer waits for capacity rather than take crumbs.
struct ClaimCapacity: Sendable {
    let concurrency: Int
    let batchSize: Int
    /// Sends not finished.
    private(set) var inFlight = 0
    /// Jobs claimed whose outcome is not written yet: their leases are extended, and the claim never
    /// returns them to this worker again meanwhile.
    private(set) var held: Set<Int64> = []

    init(concurrency: Int, batchSize: Int) {
        self.concurrency = concurrency
        self.batchSize = batchSize
    }

    /// The claim's limit now, or `nil` to wait for capacity.
    func claimLimit() -> Int? {
        let room = min(self.concurrency - self.inFlight, self.concurrency - self.held.count)
        guard room >= max(min(self.batchSize, self.concurrency) / 2, 1) else { return nil }
        return min(room, self.batchSize)
    }

    /// Of `inFlight`, the children a fan-out claimed that wait for room to be sent: at most `concurrency`
    /// sends are started, whatever a fan-out held at once.
    private(set) var deferred = 0

    /// A claim returned these jobs.
    mutating func claimed(_ ids: [Int64]) {
        self.inFlight += ids.count
        self.held.formUnion(ids)
    }

    /// A fan-out claimed these children: held and counted from now (the claimer waits for them as for any
    /// claim's), sent as ``startDeferred(upTo:)`` lets them.
    mutating func claimedDeferred(_ ids: [Int64]) {
        self.claimed(ids)
        self.deferred += ids.count
    }

    /// Deferred children that will not be sent (the worker stops, or they were claimed across a switch):
    /// no longer counted or held.
    mutating func abandonDeferred(_ ids: [Int64]) {
        let count = min(ids.count, self.deferred)
        self.deferred -= count
        self.inFlight = max(self.inFlight - count, 0)
        self.released(ids)
    }

    /// How many of `wanted` deferred children may start their sends now: as many as keep the sends started
    /// and not finished within `concurrency`.
    mutating func startDeferred(upTo wanted: Int) -> Int {
        let sending = self.inFlight - self.deferred
        let started = max(min(wanted, self.deferred, self.concurrency - sending), 0)
        self.deferred -= started
        return started
    }

    /// One send finished (its outcome is handed to the recorder).
    mutating func sendFinished() {
        self.inFlight = max(self.inFlight - 1, 0)
    }

    /// These jobs' outcomes were written (or fenced out, or set aside): no longer held.
    mutating func released(_ ids: [Int64]) {
        for id in ids { self.held.remove(id) }
    }
}
