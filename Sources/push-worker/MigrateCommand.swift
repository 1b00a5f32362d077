import ArgumentParser
import PushQueue

struct MigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Create or upgrade the push schema (idempotent; safe when several workers start at once).",
        discussion: """
            Applies the numbered files of sql/ that are not yet recorded in push.schema_migrations, under an \
            advisory lock. With --check it changes nothing: it exits 0 when the schema is current for this \
            build and 3 when migrations are pending (deploy scripts, init containers).
            """
    )

    @OptionGroup var database: DatabaseOptions
    @Flag(help: "Change nothing: exit 0 if the schema is current, 3 if migrations are pending.") var check = false
    @Flag(help: "Print the result as JSON.") var json = false

    func run() async throws {
        let json = self.json
        let check = self.check
        try await self.database.withQueue { _, client, logger in
            let migrator = Migrator(client: client, logger: logger, clock: processClock)
            if check {
                let pending = try await migrator.pending()
                let versions = try await migrator.appliedVersions()
                if json {
                    printJSON(["pending": pending.map(\.name), "schema_versions": versions.map(String.init)])
                } else if pending.isEmpty {
                    print("push schema is current (version \(versions.last ?? 0))")
                } else {
                    print(
                        "push schema is at version \(versions.last ?? 0); pending: \(pending.map(\.name).joined(separator: ", ")) (apply with push-worker migrate)"
                    )
                }
                if !pending.isEmpty { throw ExitCode(3) }
                return
            }
            let applied = try await migrator.migrate()
            let versions = try await migrator.appliedVersions()
            if json {
                printJSON(["applied": applied.map(\.name), "schema_versions": versions.map(String.init)])
            } else if applied.isEmpty {
                print("push schema is up to date (version \(versions.last ?? 0))")
            } else {
                for migration in applied { print("applied \(migration.name)") }
                print("push schema is at version \(versions.last ?? 0)")
            }
        }
    }
}
