import PushCore
import Testing

@testable import PushTransport

@Suite("The in-call rules: one request's answers judged event by event, no I/O")
struct InCallRulesTests {
    @Test("each connection effect is acted on once per request; the same answer again is the job's")
    func eachEffectOnce() {
        for (effect, step) in [
            (ConnectionEffect.reMintToken, InCallRules.Step.reMintToken), (.adoptSharedToken, .adoptSharedToken),
            (.reconnect, .reconnect),
        ] {
            var rules = InCallRules()
            #expect(rules.answered(effect: effect, carriedToken: true) == step, "\(effect)")
            #expect(rules.answered(effect: effect, carriedToken: true) == .deliver, "\(effect) a second time")
        }
        var rules = InCallRules()
        #expect(rules.answered(effect: .none, carriedToken: true) == .deliver)
        #expect(rules == InCallRules(), "an answer that is the job's changes nothing")
    }

    @Test("effects are counted apart: a re-mint, then an adoption, then a reconnect, each once")
    func effectsApart() {
        var rules = InCallRules()
        #expect(rules.answered(effect: .reMintToken, carriedToken: true) == .reMintToken)
        #expect(rules.answered(effect: .adoptSharedToken, carriedToken: true) == .adoptSharedToken)
        #expect(rules.answered(effect: .reconnect, carriedToken: true) == .reconnect)
        #expect(rules.answered(effect: .reMintToken, carriedToken: true) == .deliver)
    }

    @Test("a request that carried no token (a certificate credential) re-mints and adopts nothing, but reconnects")
    func noToken() {
        var rules = InCallRules()
        #expect(rules.answered(effect: .reMintToken, carriedToken: false) == .deliver)
        #expect(rules.answered(effect: .adoptSharedToken, carriedToken: false) == .deliver)
        #expect(!rules.reMinted && !rules.adoptedShared)
        #expect(rules.answered(effect: .reconnect, carriedToken: false) == .reconnect)
        // A later answer with a token may still re-mint: nothing was spent on the tokenless one.
        #expect(rules.answered(effect: .reMintToken, carriedToken: true) == .reMintToken)
    }

    @Test("a request the peer did not process is resent 8 times, then failed; at once when the caller gave up")
    func resends() {
        var rules = InCallRules()
        for resend in 1...InCallRules.maximumResends {
            #expect(rules.failed(notProcessed: true, cancelled: false) == .resend, "resend \(resend)")
        }
        #expect(rules.failed(notProcessed: true, cancelled: false) == .fail)
        var cancelled = InCallRules()
        #expect(cancelled.failed(notProcessed: true, cancelled: true) == .fail)
        var unknown = InCallRules()
        #expect(unknown.failed(notProcessed: false, cancelled: false) == .fail, "an unknown outcome is never resent")
        #expect(unknown.resends == 0)
    }
}
