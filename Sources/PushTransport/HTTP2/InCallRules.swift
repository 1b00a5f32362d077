import PushCore

/// The rules one request's answers are judged by inside a send call, as a pure state machine (no I/O, no
/// clock): an answer whose reason acts on the connection (``ConnectionEffect``: re-mint the token, adopt the
/// token another worker minted, reconnect) is acted on once per request, then the same answer again is the
/// job's; a request the peer certainly did not process is resent at once, up to ``maximumResends`` times.
/// ``PushClient`` drives it: it performs each ``Step`` and feeds the next answer back.
struct InCallRules: Sendable, Equatable {
    /// What the driver does with an answer.
    enum Step: Sendable, Equatable {
        /// The answer is the job's: hand it back.
        case deliver
        /// Replace the token the request carried, then send again.
        case reMintToken
        /// Send again with the token another worker stored for this key (if there is one; else deliver).
        case adoptSharedToken
        /// Discard the connection, then send again on another.
        case reconnect
        /// Send again at once (on another connection if this one is going).
        case resend
        /// Give the error back: the caller decides (a job given back uncounted, or an unknown outcome).
        case fail
    }

    /// How many times one request is resent that the peer certainly did not process before the call gives
    /// up (the job goes back uncounted).
    static let maximumResends = 8

    private(set) var reMinted = false
    private(set) var adoptedShared = false
    private(set) var reconnected = false
    private(set) var resends = 0

    /// Judges an answer whose reason has `effect` on the connection; `carriedToken`: the request went out
    /// with a token this call can replace (a certificate credential carries none).
    mutating func answered(effect: ConnectionEffect, carriedToken: Bool) -> Step {
        switch effect {
        case .reMintToken where !self.reMinted && carriedToken:
            self.reMinted = true
            return .reMintToken
        case .adoptSharedToken where !self.adoptedShared && carriedToken:
            self.adoptedShared = true
            return .adoptSharedToken
        case .reconnect where !self.reconnected:
            self.reconnected = true
            return .reconnect
        default:
            return .deliver
        }
    }

    /// Judges a request that got no answer: `notProcessed`, the peer certainly did not process it;
    /// `cancelled`, the caller gave up.
    mutating func failed(notProcessed: Bool, cancelled: Bool) -> Step {
        guard notProcessed else { return .fail }
        self.resends += 1
        return self.resends > Self.maximumResends || cancelled ? .fail : .resend
    }
}
