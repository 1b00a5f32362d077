import Foundation
import Logging
import PushCore
import PushQueue
import PushTransport

/// The end of a send, in one step: the answer decided (PushCore's ``Decision/decide``, the only
/// interpretation of a send), its effects on this worker (provider health, reactions), its metrics, and the
/// outcome handed to the writer.
extension PushWorkerService {
    /// A prepared job's send ended (`nil`: refused before sending): the attempt is decided, then its effects on
    /// this worker (provider health, reactions), its metrics and the outcome writer; the send no longer counts.
    func settle(_ prepared: JobProcessor.Prepared, with result: Result<ProviderAnswer, any Error>?) {
        if case .success(.apns(let response)) = result { self.skew.observe(response) }
        // A 5xx while its provider is down goes back uncounted (``ProviderOutages``).
        let attempt = self.outages.record(self.decide(prepared, with: result))
        self.reactions.react(to: attempt)
        self.metrics.count(attempt.outcome, platform: attempt.job.platform)
        var outcome = attempt.outcome
        if let tracing = self.tracing, attempt.job.traceparent != nil {
            outcome.traceSpan = tracing.record(
                attempt,
                worker: self.configuration.workerID,
                started: outcome.attemptedAt,
                now: self.clock.now
            )
        }
        self.recorder.add(outcome)
        // The claim loop waits for room for a batch (and a drain for the last send): woken only when there is,
        // not by every answer. Each wake-up with no room cost a task group, a timer and a thread switch a job.
        let (wakes, deferred) = self.state.withLock { state in
            state.capacity.sendFinished()
            return (state.shuttingDown || state.capacity.claimLimit() != nil, state.capacity.deferred > 0)
        }
        if wakes { self.sendEnded.signal() }
        if deferred { self.deferredRoom.signal() }
    }

    /// A prepared job's outcome from its send's result (`nil`: it was refused before sending): the answer as
    /// a ``SendOutcome``, PushCore's one interpretation of it (``Decision/decide``), and the row to write.
    private func decide(
        _ prepared: JobProcessor.Prepared,
        with result: Result<ProviderAnswer, any Error>?
    ) -> JobProcessor.Attempt {
        let claimed = prepared.claimed
        let job = claimed.job
        let started = claimed.started
        let policy = claimed.policy
        let warnings = claimed.warnings
        var status: Int?
        var response: APNsResponse?
        var fcmResponse: FCMResponse?
        let sendOutcome: SendOutcome
        switch result {
        case .success(.apns(let answer)):
            response = answer
            status = answer.status
            sendOutcome = .response(
                status: answer.status,
                reason: answer.reason,
                retryAfter: answer.status == 429 ? RetryAfter.parse(answer.retryAfter, now: self.clock.wallNow) : nil
            )
        case .success(.fcm(let answer)):
            fcmResponse = answer
            status = answer.status
            sendOutcome = answer.sendOutcome(at: self.clock.wallNow)
        case .failure(let error as TransportError):
            sendOutcome = .transport(error.fault, reason: error.reason)
        case .failure:
            sendOutcome = .transport(.unknownOutcome, reason: "TransportError")
        case nil:
            if case .refuse(_, let rejection) = prepared {
                sendOutcome = .rejected(rejection)
            } else {
                sendOutcome = .rejected(
                    PreSendRejection(reason: "InvalidJob", trapID: nil, message: "the job could not be prepared.")
                )
            }
        }
        var decided = Decision.decide(
            sendOutcome,
            attempt: job.attempts,
            transportRetries: job.transportRetries,
            policy: policy,
            transportBudget: self.configuration.transportBudget,
            platform: job.platform
        )
        // Only APNs' own answer repairs the environment (a token refused before sending is not the build's).
        if case .response = sendOutcome { decided = decided.repairingEnvironment(of: job) }
        let sent: Bool
        switch sendOutcome {
        case .response, .fcm: sent = true
        case .transport(let fault, _): sent = fault == .unknownOutcome
        case .rejected: sent = false
        }
        let outcome = JobOutcome(
            jobID: job.id,
            attempt: job.attempts,
            disposition: decided.decision,
            attemptedAt: started,
            status: status,
            reason: decided.reason,
            // Warnings first: they describe the payload the attempt carried, whatever APNs answered.
            trapIDs: warnings.map(\.trapID) + (decided.trapID.map { [$0] } ?? []),
            // A broadcast's answer carries apns-request-id instead: the same column keeps it. An FCM job's
            // message name goes to provider_message_id (the statement picks the column by platform).
            apnsUniqueID: response?.apnsUniqueID ?? response?.requestID ?? fcmResponse?.messageName,
            latencyMs: sent
                ? Int(
                    ((response?.latency ?? fcmResponse?.latency ?? (self.clock.now - started)).seconds * 1000)
                        .rounded()
                ) : nil,
            sent: sent,
            invalidatesToken: decided.invalidatesToken,
            apnsTimestampMs: response?.timestampMs,
            switchesEnvironment: decided.switchesEnvironment
        )
        if !warnings.isEmpty {
            self.logger.debug(
                "payload warnings",
                metadata: [
                    "push.job_id": "\(job.id)",
                    "push.traps": "\(warnings.map(\.trapID.rawValue).joined(separator: ","))",
                ]
            )
        }
        if decided.unknownReason || { if case .rejected = sendOutcome { return true } else { return false } }() {
            var logger = self.logger
            logger[metadataKey: "push.job_id"] = "\(job.id)"
            logger[metadataKey: "push.apns_id"] = "\(job.apnsID.uuidString.lowercased())"
            logger[metadataKey: "push.token_fp"] = "\(job.tokenFingerprint)"
            if decided.unknownReason {
                logger.warning(
                    "unknown \(job.platform.providerName) reason; retrying with the normal budget",
                    metadata: ["push.status": "\(status ?? 0)", "push.reason": "\(decided.reason ?? "-")"]
                )
            } else {
                logger.info(
                    "job refused before sending",
                    metadata: [
                        "push.reason": "\(decided.reason ?? "-")", "push.trap": "\(decided.trapID?.rawValue ?? "-")",
                    ]
                )
            }
        }
        return JobProcessor.Attempt(job: job, outcome: outcome, decided: decided)
    }
}
