import ArgumentParser
import PushQueue

struct MigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Create or upgrade the push schema (idempotent; safe when several workers start at once).",
        discussion: "Applies the numbered files of sql/ that are not yet recorded in push.schema_migrations, under an advisory lock."
    )

    @OptionGroup var database: DatabaseOptions
    @Flag(help: "Print the result as JSON.") var json = false

    func run() async throws {
        let json = self.json
        try await self.database.withQueue { _, client, logger in
            let migrator = Migrator(client: client, logger: logger)
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
