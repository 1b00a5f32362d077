import APNsSimulator
import Foundation
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
        unexplainedSecondSendsAllowed: Int = 0,
        oneJobPerToken: Bool = true,
        context: String = "",
        count: (String) async throws -> Int64,
        texts: (String) async throws -> [String]
    ) async throws -> String {
        // Superseded (a newer job of its coalesce_key replaced it) is a terminal state too: never sent.
        let delivered = try await count(
            "SELECT count(*) FROM push.jobs WHERE state IN ('delivered', 'superseded', 'cancelled')"
        )
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
        if oneJobPerToken {
            var apnsIDs: [String: Set<String>] = [:]
            for request in simulator.requests {
                // apns-id, or an FCM message's data.push_id.
                if let token = request.deviceToken { apnsIDs[token, default: []].insert(request.notificationID ?? "") }
            }
            #expect(
                apnsIDs.values.allSatisfy { $0.count == 1 },
                "one apns-id per job across all its requests \(context)"
            )
        } else {
            // Many jobs to one token (a Live Activity's): every request carries the apns_id of a job of its token.
            let known = Set(
                try await texts(
                    "SELECT lower(apns_id::text) || '/' || coalesce(device_token, channel_id, '') FROM push.jobs UNION ALL SELECT lower(apns_id::text) || '/' || coalesce(device_token, channel_id, '') FROM push.dead_jobs"
                )
            )
            let strays = simulator.requests.filter { request in
                guard let token = request.deviceToken else { return false }
                return !known.contains("\(request.notificationID ?? "")/\(token)")
            }
            #expect(
                strays.isEmpty,
                "every request carries the apns_id of a job of its token \(context): \(strays.count)"
            )
        }
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
            // A job that ended a dead letter (its budget spent after the answers it never read) keeps its
            // history there.
            let histories = try await texts(
                "SELECT history::text FROM push.jobs WHERE apns_id::text = ANY ('{\(ids)}') UNION ALL SELECT history::text FROM push.dead_jobs WHERE apns_id::text = ANY ('{\(ids)}')"
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
            twice.count - explained <= unexplainedSecondSendsAllowed,
            "a 200 answered twice only across a worker's death \(context): \(twice.count) twice, \(explained) explained"
        )
        // Latest wins: no older job of a coalesce key sent after a newer one was answered 200.
        let keyed = try await texts(
            "SELECT coalesce_key || '/' || topic || E'\\t' || id || E'\\t' || apns_id FROM push.jobs WHERE coalesce_key IS NOT NULL"
        ).compactMap { line -> (String, Int64, String)? in
            let parts = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard parts.count == 3, let id = Int64(parts[1]) else { return nil }
            return (String(parts[0]), id, String(parts[2]))
        }
        let stale = Self.olderSentAfterNewer(requests: simulator.requests, keyed: keyed)
        #expect(stale == 0, "no older keyed job sent after a newer one was answered 200 \(context): \(stale)")
        let transport = try await count("SELECT coalesce(sum(transport_retries), 0)::bigint FROM push.jobs")
        return
            "\(delivered) delivered, \(dead) dead, \(simulator.requests.count) requests, \(transport) transport retries, \(twice.count) jobs answered 200 twice across a worker's death, \(afterCut) after the simulator cut the connection under a written 200, \(stale) stale keyed sends"
    }

    /// Latest wins where the requests arrive: how many keyed jobs had a request arrive after a newer job of
    /// their key (higher id) was answered 200. `keyed` holds each job's key (scoped as the test likes), id
    /// and apns-id (an FCM message's `data.push_id`), which names its requests.
    static func olderSentAfterNewer(requests: [RecordedRequest], keyed: [(String, Int64, String)]) -> Int {
        var byID: [String: [RecordedRequest]] = [:]
        for request in requests {
            if let id = request.notificationID { byID[id.lowercased(), default: []].append(request) }
        }
        var stale = 0
        for (_, jobs) in Dictionary(grouping: keyed, by: \.0) {
            // Newest first: every request of an older job must arrive before the earliest 200 of a newer one.
            var newestOK: Date?
            for job in jobs.sorted(by: { $0.1 > $1.1 }) {
                let sent = byID[job.2.lowercased()] ?? []
                if let newestOK, sent.contains(where: { $0.receivedAt > newestOK }) { stale += 1 }
                if let ok = sent.filter({ $0.status == 200 }).map(\.receivedAt).min() {
                    newestOK = min(newestOK ?? ok, ok)
                }
            }
        }
        return stale
    }
}
