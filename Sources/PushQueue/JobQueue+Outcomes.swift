import Foundation
import PostgresNIO

extension JobQueue {
    /// Writes a batch of outcomes in one statement: delivered and retried jobs are updated in place, dead
    /// ones are moved to `push.dead_jobs` (deleted and inserted together, with their whole history), and
    /// invalid tokens are upserted into `push.invalid_tokens`.
    ///
    /// Each write is fenced on (id, attempt, `workerID`, state `running`): an outcome from a worker that no
    /// longer holds the attempt is refused and reported in ``OutcomeWriteResult/fenced``.
    public func writeOutcomes(_ outcomes: [JobOutcome], workerID: String) async throws -> OutcomeWriteResult {
        guard !outcomes.isEmpty else { return OutcomeWriteResult(recorded: [], fenced: []) }
        let binds = Self.bindings(outcomes, workerID: workerID, now: self.clock.now)
        var recorded: [Int64] = []
        try await self.forEachRow(of: WriteOutcomesStatement.self, binds: binds) {
            recorded.append(try $0.decode(Int64.self))
        }
        let written = Set(recorded)
        return OutcomeWriteResult(recorded: recorded, fenced: outcomes.map(\.jobID).filter { !written.contains($0) })
    }

    /// The last resort for one outcome the normal write refused (a poison row: a value the statement
    /// cannot store). A 200 is written as `delivered` with nothing else; anything else moves the job to
    /// the dead letters with `sentence`, without the side effect that may have failed (the
    /// invalid-token row). Fenced like ``writeOutcomes(_:workerID:)``.
    ///
    /// - Returns: whether the job was written (false: fenced).
    public func deadLetterUnwritable(_ outcome: JobOutcome, workerID: String, sentence: String) async throws -> Bool {
        let delivered = outcome.disposition == .delivered
        let reason = outcome.reason ?? "OutcomeWriteFailed"
        let entry = "{\"outcome\":\"\(outcome.disposition.name)\",\"unwritable\":true}"
        let rows = try await self.client.query(
            JobsSQL.writeUnwritable.query {
                $0.bind("delivered", delivered)
                $0.bind("id", outcome.jobID)
                $0.bind("attempt", Int16(clamping: outcome.attempt))
                $0.bind("worker_id", workerID)
                $0.bind("status", outcome.status.map { Int32(clamping: $0) })
                $0.bind("reason", reason)
                $0.bind("sentence", sentence)
                $0.bind("entry", entry)
            },
            logger: self.logger
        )
        for try await _ in rows.decode(Int64.self) { return true }
        return false
    }

    static func bindings(
        _ outcomes: [JobOutcome],
        workerID: String,
        now: ContinuousClock.Instant
    ) -> PostgresBindings {
        var ids: [Int64] = []
        var attempts: [Int16] = []
        var kinds: [String] = []
        var delays: [Int64] = []
        var statuses: [Int16] = []
        var reasons: [String] = []
        var traps: [String] = []
        var uniqueIDs: [String] = []
        var latencies: [Int32] = []
        var ages: [Int64] = []
        var errors: [String] = []
        var sent: [Bool] = []
        var invalidate: [Bool] = []
        var timestamps: [Int64] = []
        var spans: [String] = []
        // In id order, as every statement that locks several job rows does: no deadlock between them.
        for outcome in outcomes.sorted(by: { $0.jobID < $1.jobID }) {
            ids.append(outcome.jobID)
            attempts.append(Int16(clamping: outcome.attempt))
            kinds.append(outcome.switchesEnvironment ? "switch_environment" : outcome.disposition.name)
            delays.append(max((outcome.disposition.delay ?? .zero).milliseconds, 0))
            if case .dead(let sentence) = outcome.disposition { errors.append(sentence) } else { errors.append("") }
            // Arrays cannot carry NULL elements through the binary protocol: 0, -1 and "" stand for NULL.
            statuses.append(Int16(clamping: outcome.status ?? 0))
            reasons.append(outcome.reason ?? "")
            traps.append(outcome.trapIDs.map(\.rawValue).joined(separator: ","))
            uniqueIDs.append(outcome.apnsUniqueID ?? "")
            latencies.append(Int32(clamping: outcome.latencyMs ?? -1))
            ages.append(max((now - outcome.attemptedAt).milliseconds, 0))
            sent.append(outcome.sent)
            invalidate.append(outcome.invalidatesToken)
            timestamps.append(outcome.apnsTimestampMs ?? 0)
            spans.append(outcome.traceSpan ?? "")
        }
        var binds = NamedBindings(for: WriteOutcomesStatement.statement)
        binds.bind("ids", ids)
        binds.bind("attempts", attempts)
        binds.bind("kinds", kinds)
        binds.bind("delays_ms", delays)
        binds.bind("statuses", statuses)
        binds.bind("reasons", reasons)
        binds.bind("traps", traps)
        binds.bind("unique_ids", uniqueIDs)
        binds.bind("latencies_ms", latencies)
        binds.bind("ages_ms", ages)
        binds.bind("errors", errors)
        binds.bind("sent", sent)
        binds.bind("invalidate", invalidate)
        binds.bind("timestamps_ms", timestamps)
        binds.bind("spans", spans)
        binds.bind("worker_id", workerID)
        return binds.complete
    }
}

/// The outcome write (`Statements/write_outcomes.sql`), prepared once per connection.
enum WriteOutcomesStatement: BatchStatement {
    static let name = "push_write_outcomes_v10"
    /// `Statements/write_outcomes.sql` (with `outcome_input_rows.sql`) with its binds in order.
    static let statement = SQLStatement(
        file: "write_outcomes",
        binds: [
            "ids", "attempts", "kinds", "delays_ms", "statuses", "reasons", "traps", "unique_ids", "latencies_ms",
            "ages_ms", "errors", "sent", "invalidate", "timestamps_ms", "spans", "worker_id",
        ]
    )
    static var sql: String { Self.statement.sql }
}
