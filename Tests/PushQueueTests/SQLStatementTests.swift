import Testing

@testable import PushQueue

@Suite("Statements kept as .sql files: rendered with includes and named binds")
struct SQLStatementTests {
    @Test("the batch statements render: every bind numbered in declared order, fragments included, no description sent")
    func render() {
        for statement in [ClaimStatement.statement, WriteOutcomesStatement.statement] {
            #expect(!statement.sql.contains("{{"), "\(statement.file): an include left")
            #expect(!statement.sql.hasPrefix("--"), "\(statement.file): its description is not sent")
            for (index, _) in statement.binds.enumerated() {
                #expect(statement.sql.contains("$\(index + 1)"), "\(statement.file): $\(index + 1) unused")
            }
            #expect(!statement.sql.contains("$\(statement.binds.count + 1)"))
            // No named bind left: a colon followed by a lower-case letter, not a cast (::type).
            let leftover = statement.sql.unicodeScalars.indices.contains { index in
                let scalars = statement.sql.unicodeScalars
                guard scalars[index] == ":" else { return false }
                let next = scalars.index(after: index)
                let before = index == scalars.startIndex ? " " : scalars[scalars.index(before: index)]
                return next < scalars.endIndex && SQLStatement.isLower(scalars[next]) && before != ":"
                    && !SQLStatement.isWord(before)
            }
            #expect(!leftover, "\(statement.file): a :name not numbered")
        }
        #expect(ClaimStatement.statement.binds.count == 12 && WriteOutcomesStatement.statement.binds.count == 15)
    }

    @Test("the claim's rate formula is the one push-worker limits shows (JobQueue.available)")
    func rateFormulaInStep() {
        let formula = JobQueue.available(
            perSecond: "l.per_second",
            burst: "l.burst",
            delay: "extract(epoch FROM t.start - t.at)",
            halfLease: "$4"
        )
        #expect(ClaimStatement.sql.contains(formula))
    }

    @Test("fragments shared with SQL Swift still assembles come from the same files")
    func fragments() {
        #expect(JobQueue.jobColumns.hasPrefix("j.id, j.apns_id"))
        #expect(JobQueue.deadLetterInsertColumns.hasPrefix("id, topic"))
        #expect(JobQueue.deadConflict.hasPrefix("ON CONFLICT (id)"))
        #expect(WriteOutcomesStatement.sql.contains(JobQueue.deadConflict))
        #expect(ClaimStatement.sql.contains(JobQueue.jobColumns))
    }
}
