import Foundation
import PushCore
import PushQueue
public import Tracing

/// Makes each attempt of a traced job (a producer's `traceparent`, CONTRACT.md 1c) a span in the producer's
/// trace, after the OpenTelemetry messaging conventions: a `process` span of kind consumer, child of the
/// producer's span; a retry's span is a new span, child of the producer's too, linked to the first attempt's
/// (whose id the outcome write kept in `trace_first_span`). Spans are made only for jobs that carry a valid
/// `traceparent` and only when the worker was given a tracer (`--otlp-endpoint`): otherwise nothing is done.
/// Attributes never carry the device token (its fingerprint only) or the payload.
public struct AttemptTracing: Sendable {
    let tracer: any Tracer

    public init(tracer: any Tracer) { self.tracer = tracer }

    /// Records the attempt's span from `started` to now; returns its span id when it is the job's first
    /// traced attempt that was sent (to keep), `nil` otherwise.
    func record(
        _ attempt: JobProcessor.Attempt,
        worker: String,
        started: ContinuousClock.Instant,
        now: ContinuousClock.Instant
    ) -> String? {
        let job = attempt.job
        guard let header = job.traceparent, let parent = TraceParent(header) else { return nil }
        var context = InstrumentationContext.topLevel
        self.tracer.extract(["traceparent": parent.description], into: &context, using: HeaderExtractor())
        let wallNow = DefaultTracerClock.now.nanosecondsSinceEpoch
        let elapsed = UInt64(max((now - started).nanoseconds, 0))
        let start = DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: wallNow &- min(elapsed, wallNow))
        let span = self.tracer.startSpan("process push.jobs", context: context, ofKind: .consumer, at: start)
        let outcome = attempt.outcome
        let name: String
        switch outcome.disposition {
        case .delivered: name = "delivered"
        case .dead: name = "dead"
        case .retry: name = "retry"
        case .requeue: name = "requeued"
        case .transportRetry: name = "unknown_outcome"
        }
        var attributes: SpanAttributes = [:]
        attributes["messaging.system"] = "push-worker"
        attributes["messaging.operation.type"] = "process"
        attributes["messaging.operation.name"] = "send"
        attributes["messaging.destination.name"] = "push.jobs"
        attributes["messaging.message.id"] = job.apnsID.uuidString.lowercased()
        attributes["push.job.id"] = Int(job.id)
        attributes["push.attempt"] = outcome.attempt
        attributes["push.platform"] = job.platform.rawValue
        attributes["push.topic"] = job.topic
        attributes["push.credential"] = job.credential
        attributes["push.outcome"] = name
        attributes["push.worker"] = worker
        attributes["push.sent"] = outcome.sent
        if let token = job.deviceToken { attributes["push.token.fingerprint"] = tokenFingerprint(token) }
        if let status = outcome.status { attributes["http.response.status_code"] = status }
        if let reason = outcome.reason { attributes["push.reason"] = reason }
        if !outcome.trapIDs.isEmpty {
            attributes["push.trap_ids"] = outcome.trapIDs.map(\.rawValue).joined(separator: ",")
        }
        span.attributes = attributes
        if let first = job.traceFirstSpan, TraceParent.isHex(first), first.utf8.count == 16 {
            var linked = InstrumentationContext.topLevel
            self.tracer.extract(
                ["traceparent": TraceParent(traceID: parent.traceID, parentID: first, flags: parent.flags).description],
                into: &linked,
                using: HeaderExtractor()
            )
            span.addLink(SpanLink(context: linked, attributes: ["push.link": "first_attempt"]))
        }
        switch outcome.disposition {
        case .dead(let sentence): span.setStatus(SpanStatus(code: .error, message: sentence))
        case .retry: span.setStatus(SpanStatus(code: .error, message: outcome.reason ?? "retried"))
        default: break
        }
        span.end(at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: wallNow))
        // The first attempt that reached the provider is the one retries link to (a requeue sent nothing).
        guard job.traceFirstSpan == nil, outcome.sent else { return nil }
        var carrier: [String: String] = [:]
        self.tracer.inject(span.context, into: &carrier, using: HeaderInjector())
        return carrier["traceparent"].flatMap(TraceParent.init)?.parentID
    }
}

struct HeaderExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}
