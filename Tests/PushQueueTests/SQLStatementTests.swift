import Testing

@testable import PushQueue

@Suite("Statements kept as .sql files: rendered with includes and named binds")
struct SQLStatementTests {
    @Test("the batch statements render: every bind numbered in declared order, fragments included, no description sent")
    func render() {
        for statement in [ClaimStatement.statement, WriteOutcomesStatement.statement] {
            #expect(!statement.sql.contains("{{"), "\(statement.file): an include left")
            #expect(!statement.sql.hasPrefix("--"), "\(statement.file): its description is not sent")
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
            #expect(numbers == Set(1...statement.binds.count), "\(statement.file): \(numbers.sorted())")
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
            #expect(!leftover, "\(statement.file): a :name not numbered")
        }
        #expect(ClaimStatement.statement.binds.count == 21 && WriteOutcomesStatement.statement.binds.count == 16)
    }

    @Test("a bind named only in a comment or a string literal is not a bind")
    func commentsAndLiterals() {
        #expect(ClaimStatement.sql.contains("(:include_rate_limited false)"), "the comment keeps its words")
        #expect(!JobQueue.jobColumns.contains("--"), "no comment in a fragment included mid-line")
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
