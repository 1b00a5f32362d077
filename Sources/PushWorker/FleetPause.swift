/// One row of `push.pauses` as a worker holds it between heartbeats: a credential, a topic, or both (a `nil`
/// side matches any).
struct FleetPause: Sendable, Hashable {
    let credential: String?
    let topic: String?

    /// Whether it pauses a job of `credential` and `topic`: the one rule, for the send's withdrawal and for
    /// the claim that finds a cached pause lifted.
    func matches(credential: String, topic: String) -> Bool {
        (self.credential ?? credential) == credential && (self.topic ?? topic) == topic
    }
}
