import Testing

@testable import PushQueue

@Suite("Statements kept as .sql files: rendered with includes and named binds")
struct SQLStatementTests {
    @Test("the batch statements render: every bind numbered in declared order, fragments included, no description sent")
    func render() {
        for statement in [ClaimStatement.statement, WriteOutcomesStatement.statement] + Self.named {
            #expect(!statement.sql.contains("{{"), "\(statement.location): an include left")
            #expect(!statement.sql.hasPrefix("--"), "\(statement.location): its description is not sent")
            // Every $n of the statement, read whole ($1 is not a prefix of $12 here).
            var numbers = Set<Int>()
            var digits = ""
            var afterDollar = false
            for character in statement.sql + " " {
                if afterDollar, character.isNumber {
                    digits.append(character)
                    continue
                }
                if afterDollar, let number = Int(digits) { numbers.insert(number) }
                afterDollar = character == "$"
                digits = ""
            }
            #expect(
                numbers == Set(statement.binds.indices.map { $0 + 1 }),
                "\(statement.location): \(numbers.sorted())"
            )
            // No named bind left outside comments: a colon followed by a lower-case letter, not a cast (::type).
            let code = statement.sql.split(separator: "\n").map { line in
                line.range(of: "--").map { line[..<$0.lowerBound] } ?? line
            }.joined(separator: "\n")
            let leftover = code.unicodeScalars.indices.contains { index in
                let scalars = code.unicodeScalars
                guard scalars[index] == ":" else { return false }
                let next = scalars.index(after: index)
                let before = index == scalars.startIndex ? " " : scalars[scalars.index(before: index)]
                return next < scalars.endIndex && SQLStatement.isLower(scalars[next]) && before != ":"
                    && !SQLStatement.isWord(before)
            }
            #expect(!leftover, "\(statement.location): a :name not numbered")
        }
        #expect(ClaimStatement.statement.binds.count == 21 && WriteOutcomesStatement.statement.binds.count == 16)
    }

    @Test("a bind named only in a comment or a string literal is not a bind")
    func commentsAndLiterals() {
        #expect(ClaimStatement.sql.contains("(:include_rate_limited false)"), "the comment keeps its words")
        #expect(!JobQueue.jobColumns.contains("--"), "no comment in a fragment included mid-line")
    }

    /// Every named statement of the tables' files, as their Swift side declares them.
    static let named =
        WorkersSQL.all + ControlsSQL.all + JobsSQL.all + WebhooksSQL.all + ProviderTokensSQL.all + DeadJobsSQL.all
        + MigrationsSQL.all + SessionSQL.all + DevicesSQL.all + ActivitiesSQL.all

    @Test("every statement of a table's file is declared in Swift, once, and each file holds only those")
    func everyNamedStatementDeclared() {
        for file in [
            "workers", "controls", "jobs", "webhooks", "provider_tokens", "dead_jobs", "migrations", "session",
            "devices", "activities",
        ] {
            let declared = Self.named.filter { $0.file == file }.compactMap(\.name)
            #expect(Set(declared).count == declared.count, "\(file).sql: a statement declared twice")
            #expect(Set(SQLStatement.names(in: file)) == Set(declared), "\(file).sql")
            #expect(SQLStatement.names(in: file).count == declared.count, "\(file).sql: a name used twice")
        }
    }

    @Test("the claim and push-worker limits read the rate formula from one SQL function (migration 0016)")
    func rateFormulaInOnePlace() {
        #expect(ClaimStatement.sql.contains("push.rate_available(l.per_second, l.burst,"))
        #expect(ControlsSQL.rateLimits.sql.contains("push.rate_available(per_second::float8, burst::float8,"))
        #expect(!ClaimStatement.sql.contains("1e-9"), "the formula itself lives in the function only")
        #expect(ControlsSQL.cancel.sql.contains("'\(JobQueue.cancelNotificationPrefix)'"))
    }

    @Test("fragments shared with SQL Swift still assembles come from the same files")
    func fragments() {
        #expect(JobQueue.jobColumns.hasPrefix("j.id, j.apns_id"))
        #expect(SQLStatement.fragment("dead_letter_columns").hasPrefix("id, topic"))
        #expect(SQLStatement.fragment("dead_conflict").hasPrefix("ON CONFLICT (id)"))
        #expect(WriteOutcomesStatement.sql.contains(SQLStatement.fragment("dead_conflict")))
        #expect(ClaimStatement.sql.contains(JobQueue.jobColumns))
    }
}
