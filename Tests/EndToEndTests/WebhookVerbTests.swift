import Foundation
import PushProcess
import PushQueueTesting
import Testing

/// The `webhooks` verbs with the real binary: add (refusing what the receiver could never be given), list
/// with the outbox's counts, remove.
@Suite("push-worker webhooks: add, list, remove")
struct WebhookVerbTests {
    @Test(
        "add refuses unknown events, a relative, outside or world-readable secret file and a non-HTTP URL, naming the fix; list shows the outbox; remove exits 1 for a missing hook"
    )
    func verbs() async throws {
        try await DaemonFixture.run { f in
            let secret = f.directory + "/hook.secret"
            try "s3cret\n".write(toFile: secret, atomically: true, encoding: .utf8)
            chmod(secret, 0o644)
            let open = try await f.cli([
                "webhooks", "add", "https://hooks.example.com/p", "--events", "dead", "--secret-file", secret,
            ])
            #expect(open.status != 0 && open.output.contains("chmod 600"), "\(open.output)")
            chmod(secret, 0o600)
            for (arguments, says) in [
                (["https://hooks.example.com/p", "--events", "dead,sent"], "not sent"),
                (["ftp://hooks.example.com/p", "--events", "dead"], "http:// or https://"),
                (["https://hooks.example.com/p", "--events", "dead", "--secret-file", "hook.secret"], "absolute path"),
                (
                    ["https://hooks.example.com/p", "--events", "dead", "--secret-file", "/etc/hostname"],
                    "not inside the workers' secrets directory \(f.directory)"
                ),
                (
                    ["https://hooks.example.com/p", "--events", "dead", "--secret-file", f.directory + "/../x.secret"],
                    "not inside the workers' secrets directory"
                ),
            ] {
                let full =
                    ["webhooks", "add"] + arguments
                    + (arguments.contains("--secret-file") ? [] : ["--secret-file", secret])
                let refused = try await f.cli(full)
                #expect(refused.status != 0 && refused.output.contains(says), "\(arguments): \(refused.output)")
            }
            let added = try await f.cli([
                "webhooks", "add", "https://hooks.example.com/p", "--events", "delivered,dead", "--topic",
                "com.example.app",
                "--secret-file", secret,
            ])
            #expect(added.status == 0 && added.output.contains("added webhook 1"), "\(added.output)")
            #expect(!added.output.contains("s3cret"))
            try await f.db.execute(
                "INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body, attempts, last_error) VALUES (1, 'dead', 7, '{}', 2, 'the receiver answered 500')"
            )
            let listed = try await f.cli(["webhooks"])
            #expect(listed.status == 0, "\(listed.output)")
            #expect(
                listed.output.contains(
                    "1  https://hooks.example.com/p  events delivered,dead  topic com.example.app  waiting 1 (failing 1)  dead 0"
                ),
                "\(listed.output)"
            )
            let json = try await f.cli(["webhooks", "list", "--json"])
            #expect(json.output.contains("\"secret_file\"") && !json.output.contains("s3cret"), "\(json.output)")
            #expect(try await f.cli(["webhooks", "remove", "1"]).status == 0)
            let again = try await f.cli(["webhooks", "remove", "1"])
            #expect(again.status == 1 && again.output.contains("no webhook 1"), "\(again.output)")
            #expect(try await f.db.int64("SELECT count(*) FROM push.webhook_deliveries") == 0)
        }
    }

    @Test(
        "list, add and show never print a receiver's token (a URL's query, user info) nor a row's CR/LF: the URL is shown as scheme, host and path"
    )
    func urlsShownSafely() async throws {
        try await DaemonFixture.run { f in
            let secret = f.directory + "/hook.secret"
            try "s3cret\n".write(toFile: secret, atomically: true, encoding: .utf8)
            chmod(secret, 0o600)
            let added = try await f.cli([
                "webhooks", "add", "https://hooks.example.com/p?token=tok-123", "--events", "dead", "--secret-file",
                secret,
            ])
            #expect(added.status == 0 && !added.output.contains("tok-123"), "\(added.output)")
            #expect(added.output.contains("https://hooks.example.com/p?…"), "\(added.output)")
            // A row written by SQL: user info, a fragment, and a CR/LF that would forge a line of the listing.
            try await f.db.execute(
                "INSERT INTO push.webhooks (url, events, secret_file) VALUES (E'https://user:pw-456@hooks.example.com/q\\r\\n2  https://forged.example.com#frag', '{dead}', '/etc/secret')"
            )
            for arguments in [["webhooks"], ["webhooks", "list", "--json"], ["webhooks", "show", "2"]] {
                let shown = try await f.cli(arguments)
                #expect(shown.status == 0, "\(arguments): \(shown.output)")
                #expect(!shown.output.contains("tok-123") && !shown.output.contains("pw-456"), "\(shown.output)")
                #expect(
                    !shown.output.contains("\r") && !shown.output.contains("\n2  https://forged"),
                    "\(shown.output)"
                )
            }
        }
    }
}
