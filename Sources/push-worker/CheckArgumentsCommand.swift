import APNsTransport
import ArgumentParser

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

/// `push-worker check-keys`: load every configured signing key as `run` would, and connect to nothing.
struct CheckKeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-keys",
        abstract:
            "Load every configured APNs key and certificate as run would (permissions, key type, ids, expiry) and connect to nothing.",
        discussion: """
            For deploy checks and pod debugging: `push-worker check-keys --config /etc/push-worker/config.json` \
            prints one line per credential, or the sentence that says what to fix (a world-readable key, a \
            symlink to the wrong file, an empty APNS_KEY_PATH). Never prints key material.
            """
    )

    @OptionGroup var apns: APNsOptions

    func run() throws {
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
        if let proxy = try self.apns.proxy() { print("ok: https proxy \(proxy)") }
    }
}
