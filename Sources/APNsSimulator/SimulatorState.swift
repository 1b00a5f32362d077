import Foundation
import NIOCore

/// The simulator's mutable state, behind its lock.
struct SimulatorState {
    var scripts: [String: SimulatorBehaviour] = [:]
    /// Device tokens' builds (``APNsSimulator/register(token:environment:)``).
    var tokenEnvironments: [String: String] = [:]
    /// Live Activity tokens and what their device showed last (``APNsSimulator/registerLiveActivity(token:kind:)``).
    var liveActivityTokens: [String: LiveActivityDevice] = [:]
    var droppedByDevice: [DroppedPush] = []
    var scriptCounts: [String: Int] = [:]
    var requests: [RecordedRequest] = []
    var connections: [Int: any Channel] = [:]
    var authenticatedConnections: Set<Int> = []
    /// Requests read per connection (a connection closed with none is connect/disconnect churn).
    var requestsPerConnection: [Int: Int] = [:]
    /// When connections closed without a request.
    var idleCloses: [Date] = []
    /// Priority-10 Live Activity sends per device token (the budget's window).
    var liveActivitySends: [String: [Date]] = [:]
    var connectionCount = 0
    var openStreams = 0
    var maxOpenStreams = 0
    var announcedMaxStreams: Int?
    /// The newest token seen per key id: its `iat`.
    var latestTokenIssuedAt: [String: Int64] = [:]
    /// Verified JWTs, so each is checked once.
    var verifiedTokens: [String: JWTVerifier.Claims] = [:]
    /// The fault plan's random numbers, its request count, and what it did.
    var faultRandom = SeededGenerator(seed: 1)
    var faultRequests = 0
    var faults = FaultCounters()
    /// Per connection: the GOAWAY the simulator sent (last stream id, when).
    var goAways: [Int: (last: Int, at: ContinuousClock.Instant)] = [:]
    /// When each connection's GOAWAY was written to its socket (lateness counts from there).
    var goAwayWrittenAt: [Int: ContinuousClock.Instant] = [:]
    /// When the HEADERS opening each stream was read off its connection (by connection channel and stream
    /// id), in frame order on the event loop: a stream's handler may run much later on a loaded machine.
    var streamReadAt: [StreamKey: ContinuousClock.Instant] = [:]

    struct StreamKey: Hashable {
        var connection: ObjectIdentifier
        var stream: Int
    }
    /// Per connection: the highest stream whose answer the simulator has committed to write. A GOAWAY's
    /// last-stream-id is never below it: a stream being answered was processed.
    var answeringStreamID: [Int: Int] = [:]
    /// Numbers the decisions to answer, in order.
    var answerSequence = 0
    /// Per connection: the streams with a request read and no answer yet.
    var openStreamIDs: [Int: Set<Int>] = [:]
    /// apns-ids seen, to tell first attempts.
    var seenAPNsIDs: Set<String> = []
    /// Broadcast channels per bundle id, with their message-storage policy.
    var channels: [String: [String: Int]] = [:]
    /// Key ids whose provider tokens are refused now, with the reason (a revoked or misconfigured key).
    var refusedKeys: [String: String] = [:]
    /// Sends answered with this 5xx status (a regional outage: all of them; a brownout: a share), until lifted.
    var outage: (status: Int, share: Double)?
    /// Per connection: the provider certificate it presented in TLS (`nil` inside: none).
    var clientCertificates: [Int: ProviderCertificateInfo?] = [:]
    /// FCM: access tokens granted (client email, project, expiry in seconds since the epoch), accounts whose
    /// assertions the token endpoint refuses, and messages accepted.
    var accessTokens: [String: (email: String, project: String, expires: Double)] = [:]
    var refusedAccounts: Set<String> = []
    var fcmMessages = 0
    var usedAccessTokens: Set<String> = []
    /// Certificate topics refused now, with the reason (BadCertificate: revoked).
    var refusedCertificates: [String: String] = [:]

    /// The behaviour for this request's token, counting the request against `failThenSucceed`-style scripts.
    mutating func behaviour(for token: String) -> SimulatorBehaviour? {
        guard let script = self.scripts[token] else { return nil }
        let count = self.scriptCounts[token, default: 0]
        self.scriptCounts[token] = count + 1
        switch script {
        case .failThenSucceed(let times, let status, let reason):
            return count < times ? .respond(status: status, reason: reason) : nil
        case .retryAfter(let seconds, let times):
            return count < times ? .retryAfter(seconds: seconds, times: times) : nil
        case .times(let limit, let behaviour):
            return count < limit ? behaviour : nil
        default:
            return script
        }
    }
}

/// What the simulator read from a provider certificate a client presented.
struct ProviderCertificateInfo: Sendable {
    var commonName: String
    /// The bundle id it pushes for (UID, else the common name after `: `).
    var topic: String
    /// `development`, `production`, or both (Apple's universal "Apple Push Services" certificate).
    var environments: Set<String>
}
