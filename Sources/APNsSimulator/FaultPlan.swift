/// Connection-level faults the simulator plays on its own, as hostile as Apple may be: GOAWAY that leaves
/// higher streams unanswered, dropped connections, stream resets, throttling and 5xx, slow answers.
/// Seeded, so a failing schedule can be replayed.
public struct FaultPlan: Sendable, Hashable {
    /// Every Nth request (counted over the whole server) triggers GOAWAY (NO_ERROR, `{"reason":"Shutdown"}`)
    /// on its connection, with a last-stream-id below most of the streams in flight there: streams at
    /// or below it are answered, higher ones never are; the connection stays open for ``goAwayGrace``.
    public var goAwayEvery: Int?
    /// How long a connection stays open after its GOAWAY (Apple may keep it a while).
    public var goAwayGrace: Duration = .seconds(2)
    /// Every Nth request drops the TCP connection without GOAWAY.
    public var dropEvery: Int?
    /// The share of first attempts (by apns-id) answered with RST_STREAM INTERNAL_ERROR.
    public var resetFirstAttempts: Double = 0
    /// The share of 200 answers written as HEADERS without END_STREAM followed by RST_STREAM (NO_ERROR):
    /// the push was delivered, and a client that waits for END_STREAM must still count it delivered.
    public var okThenResetShare: Double = 0
    /// The share of requests answered 429 TooManyRequests (Retry-After: 1).
    public var throttleShare: Double = 0
    /// The share of requests answered 500 or 503.
    public var serverErrorShare: Double = 0
    /// The share of requests answered after ``slowLatency``.
    public var slowShare: Double = 0
    /// How slow a slow answer is.
    public var slowLatency: Duration = .milliseconds(300)
    /// The random seed.
    public var seed: UInt64 = 1

    /// No faults.
    public init() {}

    /// Whether any fault is configured.
    public var isActive: Bool {
        self.goAwayEvery != nil || self.dropEvery != nil || self.resetFirstAttempts > 0 || self.throttleShare > 0
            || self.serverErrorShare > 0 || self.slowShare > 0 || self.okThenResetShare > 0
    }
}

/// What the fault plan did, and what it saw, for tests to assert on.
public struct FaultCounters: Sendable, Hashable {
    /// GOAWAY frames sent.
    public var goAways = 0
    /// FCM access tokens the token endpoint granted.
    public var accessTokenGrants = 0
    /// Distinct FCM access tokens that sends carried (one for a fleet that shares its token).
    public var accessTokensUsed = 0
    /// Connections refused because too many before them closed without a request (connect/disconnect churn).
    public var churnRefusals = 0
    /// Connections sent back to one stream (SETTINGS) after a rejected provider token.
    public var streamLimitDrops = 0
    /// Connections dropped without GOAWAY.
    public var drops = 0
    /// Streams reset.
    public var resets = 0
    /// 429/5xx answers.
    public var errors = 0
    /// 200s written without END_STREAM and then reset (``FaultPlan/okThenResetShare``).
    public var okThenResets = 0
    /// Streams above a GOAWAY's last-stream-id left unanswered.
    public var unansweredAfterGoAway = 0
    /// Answers written on a stream above its connection's GOAWAY last-stream-id: a simulator that says
    /// "not processed" and answers anyway. Always 0; tests assert it.
    public var answeredAboveGoAway = 0
    /// Requests that arrived on a connection after the simulator sent it GOAWAY.
    public var openedAfterGoAway = 0
    /// Of those, how many arrived more than 1 s after the GOAWAY was written to the socket (not when it
    /// was decided: behind a backlog of answers it leaves later): the client had long had it to read
    /// (earlier ones were on the wire, or waited for a busy event loop to read the frame).
    public var openedLateAfterGoAway = 0
    /// The latest any request arrived after its connection's GOAWAY was written to the socket.
    public var maxLatenessAfterGoAway: Duration = .zero
    /// 200s per apns-id, counted when the answer was written.
    public var okAnswers: [String: Int] = [:]
    /// For each apns-id answered 200, the connections the 200s went out on, in the order the simulator
    /// decided to answer them (not the order the writes finished, which a loaded machine may swap).
    public var okAnswerConnections: [String: [Int]] {
        self.okAnswerLog.mapValues { $0.sorted { $0.sequence < $1.sequence }.map(\.connection) }
    }
    var okAnswerLog: [String: [AnsweredOK]] = [:]
    /// Connections the fault plan cut (dropped, or closed after a GOAWAY's grace): a 200 written there
    /// may never have been read, so its request has an unknown outcome and is rightly sent again.
    public var cutConnections: Set<Int> = []
}

/// One 200 the simulator wrote: when it decided to (a sequence number) and on which connection.
struct AnsweredOK: Sendable, Hashable {
    var sequence: Int
    var connection: Int
}

/// SplitMix64: a small seeded generator, so a fault schedule (the simulator's, or a test's) replays.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    var state: UInt64
    /// A generator whose draws are fixed by `seed`.
    public init(seed: UInt64) { self.state = seed }
    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
