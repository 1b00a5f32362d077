/// What the simulator does with a request for one device token (or channel id), after validation.
public indirect enum SimulatorBehaviour: Sendable, Hashable {
    /// Behave as `behaviour` for the first `count` requests, then answer 200.
    case times(Int, SimulatorBehaviour)
    /// Always answer this status and reason (`reason` nil: no body).
    case respond(status: Int, reason: String?)
    /// Answer `status`/`reason` for the first `times` requests, then 200.
    case failThenSucceed(times: Int, status: Int, reason: String)
    /// Answer 429 TooManyRequests with `Retry-After: seconds` for the first `times` requests, then 200.
    case retryAfter(seconds: Int, times: Int)
    /// Answer 410 Unregistered with this `timestamp` (milliseconds since the epoch).
    case unregistered(timestampMs: Int64)
    /// Wait this long, then answer 200.
    case latency(Duration)
    /// Never answer (the client's deadline must fire).
    case hang
    /// Reset the stream (RST_STREAM INTERNAL_ERROR) without an answer.
    case resetStream
    /// Send GOAWAY naming the previous stream as the last processed, so this request and any newer ones
    /// on the connection are unprocessed; then close.
    case goAway
    /// Close the TCP connection without an answer.
    case dropConnection
}
