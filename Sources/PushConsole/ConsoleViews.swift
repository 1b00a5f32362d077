/// The console's pages as typed view models, rendered by their `.mustache` templates (swift-mustache reads
/// the stored properties by name, through `Mirror`: so a flag such as `hasGroups` is stored, not computed).
/// Each page template opens its model with `{{#page}}`; a name the page's model
/// does not have (`base`, `csrf`, `canChange`, `writable`, `signedIn`) is read from the layout's model
/// around it. An optional property that is `nil` closes its section (`{{#next}}`), as an absent key did.

/// Every page's frame: who is signed in, where the console is mounted, the title; `page` is the page's
/// own model and `body` the rendered page inside the layout.
struct LayoutView<Page> {
    let base: String
    let writable: Bool
    let canSignIn: Bool
    let title: String
    let signedIn: Bool
    let `operator`: String
    let viewer: Bool
    let canChange: Bool
    let csrf: String
    let page: Page
    var body = ""
}

// MARK: overview

struct OverviewView {
    struct Card {
        let label: String
        let value: String
        let alert: Bool
    }
    struct DeadMix {
        let reason: String
        let reasonQuery: String
        let count: String
        let trap: String?
        let diedWith: String
    }
    struct PauseRow {
        let credential: String
        let topic: String
        let credentialValue: String
        let topicValue: String
        let reason: String
        let age: String
        let createdBy: String
    }
    struct LimitRow {
        let credential: String
        let topic: String
        let perSecond: String
        let burst: String
        let available: String
    }
    struct WorkerRow {
        let id: String
        let host: String
        let pid: Int
        let credentials: String
        let heartbeat: String
        let state: String
        let stateClass: String
    }

    let cards: [Card]
    let chart: String
    let deliveredHour: String
    let deadHour: String
    let deadMix: [DeadMix]
    let pauses: [PauseRow]
    let limits: [LimitRow]
    let workers: [WorkerRow]
    let hasDeadMix: Bool
    let hasPauses: Bool
    let hasLimits: Bool
    let hasWorkers: Bool
}

// MARK: dead letters

/// A trap's runbook entry, as advice beside what met it.
struct AdviceView {
    let code: String
    let title: String
    let html: String
}

struct DeadLettersView {
    struct Filter {
        let trap: String
        let reason: String
        let topic: String
        let since: String
        let limit: String
        let diedWith: String?
        let ids: String?
    }
    struct Group {
        let count: String
        let reason: String
        let trap: String
        let newest: String
        let example: String
        let query: String
        let advice: AdviceView?
    }
    struct Letter {
        let id: Int64
        let deadAt: String
        let reason: String
        let status: String?
        let traps: String
        let topic: String
        let target: String
        let attempts: Int
        let error: String
    }

    let filter: Filter
    let filtered: Bool
    let paged: Bool
    let sampled: String?
    let groups: [Group]
    let letters: [Letter]
    let next: String?
    let hasGroups: Bool
    let hasLetters: Bool
}

// MARK: one dead letter, one job

/// A job's facts, advice, attempt history and the request a send would issue: both detail pages.
struct DetailView {
    struct Fact {
        let name: String
        let value: String
    }
    struct Attempt {
        let number: String
        let at: String
        let outcome: String
        let details: String
    }
    struct Header {
        let name: String
        let value: String
    }
    struct Warning {
        let code: String
        let message: String
    }
    struct Request {
        let line: String
        let credential: String
        let headers: [Header]
        let bytes: String
        let limit: String
        let warnings: [Warning]
        let payload: String?
    }
    struct Rejected {
        let reason: String
        let message: String
        let trap: String?
    }

    let facts: [Fact]
    let attempts: [Attempt]
    let advice: [AdviceView]
    let request: Request?
    let rejected: Rejected?
    /// The dead letter's id and sentence (the job page has neither).
    var id: Int64?
    var error: String?
    let hasAttempts: Bool
}

// MARK: changes

struct ReplayView {
    struct Moved {
        let id: Int64
        let apnsID: String
        let reason: String
        let expired: Bool
    }
    struct Invalid {
        let id: Int64
        let rule: String
    }
    struct Hidden {
        let name: String
        let value: String
    }

    let summary: String
    let truncated: Bool
    let confirmIDs: String
    let moved: [Moved]
    let conflicts: [Int64]
    let invalid: [Invalid]
    let preview: Bool
    let canConfirm: Bool
    let movedCount: String
    let hidden: [Hidden]
    let newAPNsID: Bool
    let expiresIn: String
    let hasMoved: Bool
    let hasConflicts: Bool
    let hasInvalid: Bool
}

struct PurgeView {
    struct Group {
        let count: String
        let reason: String
        let trap: String
    }

    let summary: String
    let groups: [Group]
    let preview: Bool
    let any: Bool
    let olderThan: String
    let cutoff: String
    let hasGroups: Bool
}

struct MessageView {
    struct Link {
        let href: String
        let label: String
    }

    let text: String
    let kind: String
    let links: [Link]
}

/// The sign-in page reads only the layout's model.
struct LoginView {}

// MARK: a Live Activity

struct ActivityView {
    struct Event {
        let job: String
        let event: String
        let timestamp: String
        let priority: String
        let state: String
        let outcome: String
    }
    let facts: [DetailView.Fact]
    let events: [Event]
    let hasEvents: Bool
}
