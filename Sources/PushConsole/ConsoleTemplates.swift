import Mustache

/// The console's pages as Mustache templates (`Templates/*.mustache`), its style sheet and icon, compiled
/// into the binary (a daemon installed as one file has no template directory to lose). `{{x}}` escapes HTML;
/// `{{{x}}}` is used only for markup the console built itself (the chart, the runbook's advice, the page
/// body).
enum ConsoleTemplates {
    static func library() throws -> MustacheLibrary {
        var library = MustacheLibrary()
        for (name, text) in templates { try library.register(text, named: name) }
        return library
    }

    /// Each template's text by name (the file name without `.mustache`).
    static let templates: [String: String] = [
        "layout": text(PackageResources.layout_mustache),
        "overview": text(PackageResources.overview_mustache),
        "dead": text(PackageResources.dead_mustache),
        "letter": text(PackageResources.letter_mustache),
        "job": text(PackageResources.job_mustache),
        "replay": text(PackageResources.replay_mustache),
        "purge": text(PackageResources.purge_mustache),
        "login": text(PackageResources.login_mustache),
        "message": text(PackageResources.message_mustache),
        "describe": text(PackageResources.describe_mustache),
        "history": text(PackageResources.history_mustache),
        "activity": text(PackageResources.activity_mustache),
    ]

    /// `Templates/console.css`.
    static let css = text(PackageResources.console_css)
    /// `Templates/favicon.svg`.
    static let favicon = text(PackageResources.favicon_svg)

    private static func text(_ bytes: [UInt8]) -> String {
        var text = String(decoding: bytes, as: UTF8.self)
        while text.last == "\n" { text.removeLast() }
        return text
    }
}
