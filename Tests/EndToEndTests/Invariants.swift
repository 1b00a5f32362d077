import APNsSimulator
import Testing

/// The invariants every fault test ends with: every job in a named terminal state and none lost; no
/// job `running`; every dead letter with an APNs-given reason or a spent budget named in its sentence;
/// one apns-id per job across all its requests; a 200 answered twice for a job only where a worker died
/// between the 200 and the write (or the simulator cut the connection under a written 200, counted apart).
enum Invariants {
    /// Asserts the invariants through `count` (one bigint) and `texts` (one text column) queries, so any
    /// fixture can run them; returns a one-line summary.
    @discardableResult
    static func assert(
        simulator: APNsSimulator,
        jobs total: Int,
        diedWorkers: Set<String>,
        rejectedBeforeSend: Bool = false,
        context: String = "",
        count: (String) async throws -> Int64,
        texts: (String) async throws -> [String]
    ) async throws -> String {
        // Superseded (a newer job of its coalesce_key replaced it) is a terminal state too: never sent.
        let delivered = try await count("SELECT count(*) FROM push.jobs WHERE state IN ('delivered', 'superseded')")
        let dead = try await count("SELECT count(*) FROM push.dead_jobs")
        #expect(delivered + dead == Int64(total), "nothing lost \(context)")
        #expect(
            try await count("SELECT count(*) FROM push.jobs WHERE state = 'running'") == 0,
            "no job stays running \(context)"
        )
        let unexplained = try await count(
            """
            SELECT count(*) FROM push.dead_jobs
             WHERE NOT (status BETWEEN 400 AND 599 OR error LIKE '%budget%' OR error LIKE 'gave up after%'
                        OR (\(rejectedBeforeSend) AND status IS NULL AND error <> ''))
            """
        )
        #expect(unexplained == 0, "every dead letter has an APNs-given reason or names its exhausted budget \(context)")
        var apnsIDs: [String: Set<String>] = [:]
        for request in simulator.requests {
            if let token = request.deviceToken { apnsIDs[token, default: []].insert(request.headers["apns-id"] ?? "") }
        }
        #expect(apnsIDs.values.allSatisfy { $0.count == 1 }, "one apns-id per job across all its requests \(context)")
        let faults = simulator.faultCounters
        #expect(
            faults.answeredAboveGoAway == 0,
            "the simulator never answers a stream its GOAWAY called unprocessed \(context)"
        )
        // A 200 written on a connection the simulator then cut may never have been read: that request's
        // outcome was unknown to the worker, and sending it again (same apns-id) is the rule.
        let twice = faults.okAnswers.filter { $0.value > 1 }.map(\.key).filter { id in
            !(faults.okAnswerConnections[id] ?? []).dropLast().contains { faults.cutConnections.contains($0) }
        }
        let afterCut = faults.okAnswers.filter { $0.value > 1 }.count - twice.count
        var explained = 0
        if !twice.isEmpty {
            // Only across a worker's death: the job was held by a worker that died. apns-ids are UUIDs
            // the simulator saw, so they can stand in the statement's text.
            let ids = twice.filter { $0.allSatisfy { $0.isHexDigit || $0 == "-" } }.joined(separator: ",")
            let histories = try await texts(
                "SELECT history::text FROM push.jobs WHERE apns_id::text = ANY ('{\(ids)}')"
            )
            explained =
                histories.filter { history in diedWorkers.contains { history.contains("\"worker\": \"\($0)\"") } }.count
            if explained != twice.count {
                let unexplained = histories.filter { history in
                    !diedWorkers.contains { history.contains("\"worker\": \"\($0)\"") }
                }
                print(
                    "jobs answered 200 twice with no worker death to explain it \(context), histories of the first: \(unexplained.prefix(3))"
                )
            }
        }
        #expect(
            twice.count == explained,
            "a 200 answered twice only across a worker's death \(context): \(twice.count) twice, \(explained) explained"
        )
        let transport = try await count("SELECT coalesce(sum(transport_retries), 0)::bigint FROM push.jobs")
        return
            "\(delivered) delivered, \(dead) dead, \(simulator.requests.count) requests, \(transport) transport retries, \(twice.count) jobs answered 200 twice across a worker's death, \(afterCut) after the simulator cut the connection under a written 200"
    }
}
