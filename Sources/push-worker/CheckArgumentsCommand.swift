import ArgumentParser
import Foundation
import Logging
import PushCore
import PushTransport

struct CheckArgumentsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-arguments",
        abstract: "Parse a push-worker command line without running it: exit 0 if valid, 64 with the error if not.",
        discussion: """
            For deploy files and scripts: `push-worker check-arguments run --worker-id a --migrations check` \
            checks the verb, every option name and value, and the verb's own rules (e.g. --lease longer than \
            --request-timeout-ms), as `run` would at start, and connects to nothing.
            """,
        shouldDisplay: false
    )

    @Argument(parsing: .captureForPassthrough, help: "The command line after push-worker.") var arguments: [String] = []

    func run() throws {
        guard !self.arguments.isEmpty else {
            throw ValidationError("give the command line to check, e.g. check-arguments run --worker-id a")
        }
        do {
            let command = try PushWorkerCommand.parseAsRoot(self.arguments)
            guard type(of: command).configuration.commandName != "help", !(command is PushWorkerCommand) else {
                throw ValidationError("that asks for help and runs nothing; give a verb and its options")
            }
            print(
                "ok: push-worker \(type(of: command).configuration.commandName ?? "") \(self.arguments.dropFirst().joined(separator: " "))"
            )
        } catch {
            printError("push-worker \(self.arguments.joined(separator: " ")): \(PushWorkerCommand.message(for: error))")
            throw ExitCode(64)
        }
    }
}

/// `push-worker check-keys`: load every configured signing key as `run` would; with `--online`, ask APNs.
struct CheckKeysCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-keys",
        abstract:
            "Load every configured APNs key and certificate as run would (permissions, key type, ids, expiry); with --online, one real request per credential.",
        discussion: """
            For deploy checks and pod debugging: `push-worker check-keys --config /etc/push-worker/config.json` \
            prints one line per credential, or the sentence that says what to fix (a world-readable key, a \
            symlink to the wrong file, an empty APNS_KEY_PATH). Never prints key material.

            --online --topic BUNDLE_ID sends one silent background push per credential to a well-formed token \
            no device has: APNs answering BadDeviceToken means the key works; InvalidProviderToken, Forbidden or \
            TopicDisallowed name the fix, before the first real send. With DATABASE_URL it signs with the \
            fleet's shared provider token (a key refreshed by several processes is refused). Exits 1 if any \
            credential fails.
            """
    )

    @OptionGroup var apns: APNsOptions
    @OptionGroup var database: DatabaseOptions
    @Flag(help: "Also send one request per credential to APNs to prove the key works.") var online = false
    @Option(help: "With --online: the bundle id to send to (the key must be allowed to push to it).")
    var topic: String?

    /// The probe's device token: well-formed, and no device's (a fixed value, so a test can script it).
    static let probeToken = "5f9d2c0e8a7b4c31" + String(repeating: "0", count: 32) + "70757368776f726b"

    /// Only FCM credentials are configured (FCM_SERVICE_ACCOUNT_PATH, no APNs key): --online needs no topic.
    var fcmOnly: Bool {
        let env = ProcessInfo.processInfo.environment
        return (self.apns.fcmServiceAccount ?? env["FCM_SERVICE_ACCOUNT_PATH"]) != nil && self.apns.keyPath == nil
            && env["APNS_KEY_PATH"] == nil && self.apns.config == nil
    }

    func validate() throws {
        if self.online && (self.topic ?? "").isEmpty && !self.fcmOnly {
            throw ValidationError("--online needs --topic BUNDLE_ID: the app the keys send for")
        }
    }

    func run() async throws {
        let loaded = try self.apns.credentials()
        for (name, key) in loaded.keys.sorted(by: { $0.key < $1.key }) {
            print("ok: credential \(name): team \(key.teamID), key \(key.keyID)")
        }
        for (name, certificate) in loaded.certificates.sorted(by: { $0.key < $1.key }) {
            let days = Int(certificate.notValidAfter.timeIntervalSinceNow / 86_400)
            print(
                "ok: credential \(name): \(certificate), topic \(certificate.topic ?? "-"), for \(certificate.environments.sorted().joined(separator: " and "))\(days < 30 ? "; expires in \(days) days: renew it" : "")"
            )
        }
        for (name, account) in loaded.serviceAccounts.sorted(by: { $0.key < $1.key }) {
            print("ok: credential \(name) (fcm): project \(account.projectID), account \(account.clientEmail)")
        }
        if let proxy = try self.apns.proxy() { print("ok: https proxy \(proxy)") }
        // FCM's keys are proved by the token exchange alone (no message is sent, no topic needed).
        var fcmFailures = 0
        if self.online, let fcm = try self.apns.makeFCMClient(logger: Logger(label: "push-worker.check-keys")) {
            for name in fcm.credentialNames {
                do {
                    try await fcm.verify(credential: name)
                    print("ok: credential \(name) (fcm): the token endpoint granted an access token")
                } catch {
                    fcmFailures += 1
                    print("FAIL: credential \(name) (fcm): \(error)")
                }
            }
            await fcm.shutdown()
        }
        guard self.online, let topic = self.topic, !(loaded.keys.isEmpty && loaded.certificates.isEmpty) else {
            if fcmFailures > 0 { throw ExitCode(1) }
            return
        }
        let environment = try self.apns.environment
        let names = Array(Set(loaded.keys.keys).union(loaded.certificates.keys)).sorted()
        let failures = try await ChannelsCommand.withAPNsClient(self.apns, self.database) { client in
            var failures = 0
            for name in names {
                let line = await Self.probe(client, credential: name, topic: topic, environment: environment)
                print(line.text)
                if !line.ok { failures += 1 }
            }
            return failures
        }
        if failures + fcmFailures > 0 { throw ExitCode(1) }
    }

    /// One request with `credential` to the probe token, and what its answer says of the key.
    static func probe(
        _ client: APNsClient,
        credential: String,
        topic: String,
        environment: APNsEnvironment
    ) async -> (ok: Bool, text: String) {
        let job = PushJob(
            id: 0,
            apnsID: UUID(),
            topic: topic,
            deviceToken: Self.probeToken,
            payload: #"{"aps":{"content-available":1}}"#,
            pushType: "background",
            priority: 5,
            environment: environment.rawValue,
            credential: credential,
            runAt: processClock.wallNow,
            createdAt: processClock.wallNow
        )
        let prefix = "online: credential \(credential) (\(environment.rawValue), topic \(topic)): "
        do {
            let request = try RequestBuilder.describe(job, now: processClock.wallNow)
            let response = try await client.send(request, credential: credential)
            let reason = response.reason ?? ""
            switch (response.status, reason) {
            case (400, "BadDeviceToken"), (410, _), (200, _):
                return (
                    true,
                    prefix
                        + "ok: APNs accepted the key (it answered \(response.status) \(reason.isEmpty ? "" : reason) for a token no device has)"
                )
            default:
                let verdict = response.verdict
                let sentence = APNsReason(reason).sentence(status: response.status)
                return (
                    false,
                    prefix
                        + "refused: \(response.status) \(reason)\(verdict.trapID.map { " [\($0.rawValue)]" } ?? ""): \(sentence)"
                )
            }
        } catch let rejection as PreSendRejection {
            return (false, prefix + "not sent: \(rejection.message)")
        } catch {
            return (false, prefix + "could not reach APNs: \(error)")
        }
    }
}
