import Foundation
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@Suite("Provider tokens shared through push.provider_tokens")
struct ProviderTokenTableTests {
    @Test(
        "the first of concurrent mints stays stored; a token the minimum interval newer replaces it; an older never does"
    )
    func firstOfConcurrentMintsWins() async throws {
        try await TestPostgres.withDatabase { db in
            let table = ProviderTokenTable(client: db.client, logger: db.logger)
            let minted = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 - 3_600).rounded(.down))
            func token(_ name: String, _ offset: TimeInterval) -> ProviderToken {
                ProviderToken(jwt: name, issuedAt: minted.addingTimeInterval(offset))
            }
            func save(_ token: ProviderToken) async throws -> String {
                try await table.save(token, teamID: "TEAM", keyID: "KEY", minimumRefreshInterval: 20 * 60).jwt
            }
            // Another worker found no token either and minted a second later: it must send the first. A
            // refresh once the interval has passed replaces it; an older token never comes back.
            let steps: [(ProviderToken, String)] = [
                (token("first", 0), "first"),
                (token("a second later", 1), "first"),
                (token("19 minutes later", 19 * 60), "first"),
                (token("20 minutes later", 20 * 60), "20 minutes later"),
                (token("older", 10), "20 minutes later"),
            ]
            for (offered, expected) in steps {
                let stored = try await save(offered)
                #expect(stored == expected, "offered \(offered.jwt)")
                let loaded = try await table.load(teamID: "TEAM", keyID: "KEY")
                #expect(loaded?.jwt == expected)
            }
            // Another key is another row.
            let other = try await table.save(
                token("other", 1),
                teamID: "TEAM",
                keyID: "KEY2",
                minimumRefreshInterval: 1_200
            )
            #expect(other.jwt == "other")
        }
    }
    @Test("replace swaps only the token it names: a worker that lost the race gets the winner's; no row, no token")
    func replaceComparesAndSwaps() async throws {
        try await TestPostgres.withDatabase { db in
            let table = ProviderTokenTable(client: db.client, logger: db.logger)
            let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
            let foreign = ProviderToken(jwt: "signed by the replaced key", issuedAt: now.addingTimeInterval(-60))
            let mine = ProviderToken(jwt: "this worker's", issuedAt: now)
            let theirs = ProviderToken(jwt: "another worker's", issuedAt: now)
            #expect(try await table.replace(foreign, with: mine, teamID: "TEAM", keyID: "KEY") == nil)
            _ = try await table.save(foreign, teamID: "TEAM", keyID: "KEY", minimumRefreshInterval: 1_200)
            // A young token, which save would keep, is replaced when named.
            #expect(try await table.replace(foreign, with: theirs, teamID: "TEAM", keyID: "KEY")?.jwt == theirs.jwt)
            #expect(try await table.replace(foreign, with: mine, teamID: "TEAM", keyID: "KEY")?.jwt == theirs.jwt)
            #expect(try await table.load(teamID: "TEAM", keyID: "KEY")?.jwt == theirs.jwt)
        }
    }

    @Test("two workers saving at once: the one whose INSERT waited on the other's gets the other's token")
    func concurrentSavesAgree() async throws {
        try await TestPostgres.withDatabase { db in
            let table = ProviderTokenTable(client: db.client, logger: db.logger)
            let minted = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 - 60).rounded(.down))
            try await db.client.withConnection { first in
                // The first worker's INSERT, not yet committed when the second worker's statement starts.
                try await first.query("BEGIN", logger: db.logger)
                try await first.query(
                    "INSERT INTO push.provider_tokens (team_id, key_id, jwt, issued_at) VALUES ('TEAM', 'KEY', 'first', \(minted))",
                    logger: db.logger
                )
                async let second = table.save(
                    ProviderToken(jwt: "second", issuedAt: minted.addingTimeInterval(1)),
                    teamID: "TEAM",
                    keyID: "KEY",
                    minimumRefreshInterval: 20 * 60
                )
                // Commit only once the second statement waits on the first's row lock: otherwise it would
                // start after the commit and prove nothing.
                var waited = false
                for _ in 0..<200 where !waited {
                    waited =
                        try await db.int64(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        ) > 0
                    if !waited { try await Task.sleep(for: .milliseconds(25)) }
                }
                #expect(waited, "the second save never waited on the first's INSERT")
                try await first.query("COMMIT", logger: db.logger)
                let stored = try await second
                #expect(stored.jwt == "first", "the second worker must send the token the first one stored")
            }
            let loaded = try await table.load(teamID: "TEAM", keyID: "KEY")
            #expect(loaded?.jwt == "first")
        }
    }
}
