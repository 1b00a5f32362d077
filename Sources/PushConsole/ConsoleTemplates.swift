import Mustache

/// The console's pages as Mustache templates, compiled into the binary (a daemon installed as one file has
/// no template directory to lose). `{{x}}` escapes HTML; `{{{x}}}` is used only for markup the console built
/// itself (the chart, the runbook's advice, the page body).
enum ConsoleTemplates {
    static func library() throws -> MustacheLibrary {
        var library = MustacheLibrary()
        for (name, text) in templates { try library.register(text, named: name) }
        return library
    }

    static let templates: [String: String] = [
        "layout": layout, "overview": overview, "dead": dead, "letter": letter, "job": job, "replay": replay,
        "purge": purge, "login": login, "message": message, "describe": describe, "history": history,
    ]

    static let layout = """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · PushWorker</title>
        <link rel="stylesheet" href="{{base}}/assets/console.css">
        <link rel="icon" href="{{base}}/assets/favicon.svg" type="image/svg+xml">
        </head>
        <body>
        <header>
          <a class="brand" href="{{base}}/">PushWorker</a>
          <nav><a href="{{base}}/">Overview</a><a href="{{base}}/dead">Dead letters</a></nav>
          <form method="get" action="{{base}}/jobs" class="find"><label>Job <input name="id" inputmode="numeric" size="10" placeholder="id"></label><button>Show</button></form>
          <div class="who">
          {{#signedIn}}{{operator}}{{#viewer}} (viewer){{/viewer}} · <form method="post" action="{{base}}/logout" class="inline"><input type="hidden" name="csrf" value="{{csrf}}"><button class="link">sign out</button></form>{{/signedIn}}
          {{^signedIn}}{{#canSignIn}}<a href="{{base}}/login">Sign in</a>{{/canSignIn}}{{^canSignIn}}<span class="badge">counts only</span>{{/canSignIn}}{{/signedIn}}
          </div>
        </header>
        <main>
        <h1>{{title}}</h1>
        {{{body}}}
        </main>
        </body>
        </html>
        """

    static let overview = """
        <section class="cards">
        {{#cards}}<div class="card{{#alert}} alert{{/alert}}"><div class="figure">{{value}}</div><div class="label">{{label}}</div></div>{{/cards}}
        </section>
        <section>
        <h2>Last hour</h2>
        <p class="muted">{{deliveredHour}} delivered, {{deadHour}} dead-lettered. Per minute, delivered above the line, dead letters below.</p>
        {{{chart}}}
        {{^signedIn}}<p class="muted">{{#canSignIn}}<a href="{{base}}/login">Sign in</a> to see dead letters, pauses, rate limits, workers and jobs.{{/canSignIn}}{{^canSignIn}}Counts and charts only: start the console with <code>--viewer-token-file</code> or <code>--token-file</code> and sign in to see dead letters, pauses, rate limits, workers and jobs.{{/canSignIn}}</p>{{/signedIn}}
        {{#hasDeadMix}}<h3>Dead letters of the last hour</h3>
        <table><thead><tr><th>Reason</th><th>Trap id</th><th class="n">Count</th></tr></thead><tbody>
        {{#deadMix}}<tr><td><a href="{{base}}/dead?reason={{reasonQuery}}&amp;died_with={{diedWith}}&amp;since=1h">{{reason}}</a></td><td>{{trap}}</td><td class="n">{{count}}</td></tr>{{/deadMix}}
        </tbody></table>{{/hasDeadMix}}
        </section>
        {{#signedIn}}<section>
        <h2>Pauses</h2>
        {{^pauses}}<p class="muted">Nothing is paused.</p>{{/pauses}}
        {{#hasPauses}}<table><thead><tr><th>Credential</th><th>Topic</th><th>Reason</th><th>Since</th><th>By</th><th></th></tr></thead><tbody>
        {{#pauses}}<tr><td>{{credential}}</td><td>{{topic}}</td><td>{{reason}}</td><td>{{age}}</td><td>{{createdBy}}</td>
        <td>{{#canChange}}<form method="post" action="{{base}}/resume" class="inline"><input type="hidden" name="csrf" value="{{csrf}}"><input type="hidden" name="credential" value="{{credentialValue}}"><input type="hidden" name="topic" value="{{topicValue}}"><button>Resume</button></form>{{/canChange}}</td></tr>{{/pauses}}
        </tbody></table>{{/hasPauses}}
        {{#canChange}}<form method="post" action="{{base}}/pause" class="row">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label>Credential <input name="credential" placeholder="any" size="12"></label>
        <label>Topic <input name="topic" placeholder="any" size="20"></label>
        <label>Reason <input name="reason" required size="30"></label>
        <label><input type="checkbox" name="everything" value="1"> both blank: pause every job</label>
        <button>Pause</button></form>{{/canChange}}
        </section>
        <section>
        <h2>Rate limits</h2>
        {{^limits}}<p class="muted">No rate limits.</p>{{/limits}}
        {{#hasLimits}}<table><thead><tr><th>Credential</th><th>Topic</th><th class="n">Per second</th><th class="n">Burst</th><th class="n">Claimable now</th></tr></thead><tbody>
        {{#limits}}<tr><td>{{credential}}</td><td>{{topic}}</td><td class="n">{{perSecond}}</td><td class="n">{{burst}}</td><td class="n">{{available}}</td></tr>{{/limits}}
        </tbody></table>{{/hasLimits}}
        </section>
        <section>
        <h2>Workers</h2>
        {{^workers}}<p class="muted">No worker has ever run against this database.</p>{{/workers}}
        {{#hasWorkers}}<table><thead><tr><th>Worker</th><th>Host</th><th class="n">PID</th><th>Credentials</th><th>Last heartbeat</th><th>State</th></tr></thead><tbody>
        {{#workers}}<tr><td>{{id}}</td><td>{{host}}</td><td class="n">{{pid}}</td><td>{{credentials}}</td><td>{{heartbeat}}</td><td><span class="badge {{stateClass}}">{{state}}</span></td></tr>{{/workers}}
        </tbody></table>{{/hasWorkers}}
        </section>{{/signedIn}}
        """

    static let dead = """
        <form method="get" action="{{base}}/dead" class="row filters">
        <label>Trap id <input name="trap" value="{{filter.trap}}" size="7"></label>
        <label>Reason <input name="reason" value="{{filter.reason}}" size="16"></label>
        <label>Topic <input name="topic" value="{{filter.topic}}" size="20"></label>
        <label>Since <input name="since" value="{{filter.since}}" size="6" placeholder="24h"></label>
        <label>Per page <input name="limit" value="{{filter.limit}}" size="4"></label>
        {{#filter.diedWith}}<input type="hidden" name="died_with" value="{{filter.diedWith}}"><span class="muted">died with: {{filter.diedWith}}</span>{{/filter.diedWith}}
        {{#filter.ids}}<input type="hidden" name="ids" value="{{filter.ids}}"><span class="muted">ids: {{filter.ids}}</span>{{/filter.ids}}
        <button>Filter</button> <a href="{{base}}/dead">clear</a>
        </form>
        {{^paged}}<h2>By reason and trap id</h2>
        {{^groups}}<p class="muted">No dead letters{{#filtered}} match the filter{{/filtered}}.</p>{{/groups}}{{/paged}}
        {{#sampled}}<p class="muted">{{sampled}}</p>{{/sampled}}
        {{#hasGroups}}<table class="groups"><thead><tr><th class="n">Count</th><th>Reason</th><th>Trap id</th><th>Newest</th><th>What to do</th><th></th></tr></thead><tbody>
        {{#groups}}<tr><td class="n">{{count}}</td><td><a href="{{base}}/dead?{{query}}">{{reason}}</a></td><td>{{trap}}</td><td>{{newest}}</td>
        <td class="advice">{{#advice}}<strong>{{advice.title}}</strong>{{{advice.html}}}{{/advice}}{{^advice}}<p>{{example}}</p>{{/advice}}</td>
        <td><a class="button" href="{{base}}/dead/replay?{{query}}">Replay…</a></td></tr>{{/groups}}
        </tbody></table>{{/hasGroups}}
        <h2>Dead letters{{#filtered}} matching the filter{{/filtered}}</h2>
        {{#hasLetters}}<table><thead><tr><th class="n">Job</th><th>Dead at</th><th>Reason</th><th>Trap ids</th><th>Topic</th><th>Target</th><th class="n">Attempts</th><th>What went wrong</th></tr></thead><tbody>
        {{#letters}}<tr><td class="n"><a href="{{base}}/dead/{{id}}">{{id}}</a></td><td>{{deadAt}}</td><td>{{reason}}{{#status}} ({{status}}){{/status}}</td><td>{{traps}}</td><td>{{topic}}</td><td class="mono">{{target}}</td><td class="n">{{attempts}}</td><td class="sentence">{{error}}</td></tr>{{/letters}}
        </tbody></table>{{/hasLetters}}
        {{#next}}<p><a class="button" href="{{base}}/dead?{{next}}">Older →</a></p>{{/next}}
        <h2>Purge</h2>
        <form method="get" action="{{base}}/dead/purge" class="row"><label>Dead longer than <input name="older_than" value="30d" size="5"></label><button>Preview purge…</button></form>
        """

    static let history = """
        <h2>Attempts</h2>
        {{^attempts}}<p class="muted">No attempt recorded.</p>{{/attempts}}
        {{#hasAttempts}}<table><thead><tr><th class="n">#</th><th>At</th><th>Outcome</th><th>Details</th></tr></thead><tbody>
        {{#attempts}}<tr><td class="n">{{number}}</td><td>{{at}}</td><td>{{outcome}}</td><td class="mono small">{{details}}</td></tr>{{/attempts}}
        </tbody></table>{{/hasAttempts}}
        """

    static let describe = """
        <h2>The request a send would issue now</h2>
        {{#rejected}}<p class="alert-text">Would not be sent: <strong>{{rejected.reason}}</strong>{{#rejected.trap}} [{{rejected.trap}}]{{/rejected.trap}}. {{rejected.message}}</p>{{/rejected}}
        {{#request}}<pre class="request">{{request.line}}
        authorization: bearer &lt;ES256 provider token for credential '{{request.credential}}'&gt;
        {{#request.headers}}{{name}}: {{value}}
        {{/request.headers}}</pre>
        <p>{{request.bytes}} bytes of {{request.limit}} allowed.
        {{#request.payload}}</p><pre class="payload">{{request.payload}}</pre>{{/request.payload}}{{^request.payload}} <a href="?payload=1">Show the payload</a></p>{{/request.payload}}
        {{#request.warnings}}<p class="warning">{{code}}: {{message}} (APNs accepts it; the job is sent)</p>{{/request.warnings}}{{/request}}
        """

    static let letter = """
        <dl class="facts">
        {{#facts}}<dt>{{name}}</dt><dd>{{value}}</dd>{{/facts}}
        </dl>
        <p class="sentence alert-text">{{error}}</p>
        {{#advice}}<div class="advice"><h2>{{code}}: {{title}}</h2>{{{html}}}</div>{{/advice}}
        <p><a class="button" href="{{base}}/dead/replay?ids={{id}}">Replay…</a></p>
        {{> history}}
        {{> describe}}
        """

    static let job = """
        <dl class="facts">
        {{#facts}}<dt>{{name}}</dt><dd>{{value}}</dd>{{/facts}}
        </dl>
        {{#advice}}<div class="advice"><h2>{{code}}: {{title}}</h2>{{{html}}}</div>{{/advice}}
        {{> history}}
        {{> describe}}
        """

    static let replay = """
        <p>{{summary}}</p>
        {{#hasMoved}}<h2>{{#preview}}Would move{{/preview}}{{^preview}}Moved{{/preview}} back to the queue</h2>
        {{#truncated}}<p class="muted">The first 500 of {{movedCount}} are listed.</p>{{/truncated}}
        <table><thead><tr><th class="n">Job</th><th>apns-id{{#newAPNsID}} (a new one replaces it){{/newAPNsID}}{{^newAPNsID}} it will be sent with{{/newAPNsID}}</th><th>Died with</th><th></th></tr></thead><tbody>
        {{#moved}}<tr><td class="n"><a href="{{base}}/dead/{{id}}">{{id}}</a></td><td class="mono">{{apnsID}}</td><td>{{reason}}</td><td>{{#expired}}<span class="badge alert">expired: will die Expired again; set a new expiry</span>{{/expired}}</td></tr>{{/moved}}
        </tbody></table>{{/hasMoved}}
        {{#hasConflicts}}<h2>Conflicts: stay dead</h2><p>Their id or apns-id is already in the queue (a producer re-sent it, or an earlier replay).</p>
        <ul>{{#conflicts}}<li><a href="{{base}}/dead/{{.}}">{{.}}</a></li>{{/conflicts}}</ul>{{/hasConflicts}}
        {{#hasInvalid}}<h2>Refused: break a rule the schema checks</h2>
        <ul>{{#invalid}}<li><a href="{{base}}/dead/{{id}}">{{id}}</a>: {{rule}}</li>{{/invalid}}</ul>{{/hasInvalid}}
        {{#preview}}
        <form method="get" action="{{base}}/dead/replay" class="row">
        {{#hidden}}<input type="hidden" name="{{name}}" value="{{value}}">{{/hidden}}
        <label><input type="checkbox" name="new_apns_id" value="1"{{#newAPNsID}} checked{{/newAPNsID}}> new apns-id</label>
        <label>New expiry in <input name="expires_in" value="{{expiresIn}}" size="5" placeholder="1h"></label>
        <button>Preview again</button></form>
        {{#canConfirm}}{{#canChange}}<form method="post" action="{{base}}/dead/replay" class="confirm">
        <input type="hidden" name="csrf" value="{{csrf}}">
        {{#hidden}}<input type="hidden" name="{{name}}" value="{{value}}">{{/hidden}}
        {{#newAPNsID}}<input type="hidden" name="new_apns_id" value="1">{{/newAPNsID}}
        <input type="hidden" name="expires_in" value="{{expiresIn}}">
        <input type="hidden" name="confirm_ids" value="{{confirmIDs}}">
        <button class="danger">Replay these {{movedCount}} now</button></form>{{/canChange}}
        {{^canChange}}<p class="muted">{{#writable}}Sign in with the operator token to replay.{{/writable}}{{^writable}}This console makes no changes: start it with <code>--token-file</code> to replay from here, or run <code>push-worker dead replay</code>.{{/writable}}</p>{{/canChange}}{{/canConfirm}}
        {{/preview}}
        """

    static let purge = """
        <p>{{summary}}</p>
        {{#hasGroups}}<table><thead><tr><th class="n">Count</th><th>Reason</th><th>Trap id</th></tr></thead><tbody>
        {{#groups}}<tr><td class="n">{{count}}</td><td>{{reason}}</td><td>{{trap}}</td></tr>{{/groups}}
        </tbody></table>{{/hasGroups}}
        {{#preview}}{{#any}}{{#canChange}}<form method="post" action="{{base}}/dead/purge" class="confirm">
        <input type="hidden" name="csrf" value="{{csrf}}"><input type="hidden" name="older_than" value="{{olderThan}}">
        <input type="hidden" name="cutoff" value="{{cutoff}}">
        <button class="danger">Delete these dead letters</button></form>{{/canChange}}
        {{^canChange}}<p class="muted">{{#writable}}Sign in with the operator token to purge.{{/writable}}{{^writable}}This console makes no changes: start it with <code>--token-file</code> to purge from here, or run <code>push-worker dead purge</code>.{{/writable}}</p>{{/canChange}}{{/any}}{{/preview}}
        """

    static let login = """
        {{#canSignIn}}<form method="post" action="{{base}}/login" class="stack">
        <label>Your name (goes into the log with every change and every payload you read) <input name="operator" required maxlength="40" autocomplete="username"></label>
        <label>Console token (the contents of the console's --token-file, or --viewer-token-file to read only) <input name="token" type="password" required autocomplete="current-password"></label>
        <button>Sign in</button></form>{{/canSignIn}}
        {{^canSignIn}}<p>This console was started without a token, so it shows counts and charts only and nobody can sign in. Start it with <code>--viewer-token-file FILE</code> (read-only) or <code>--token-file FILE</code> (changes too).</p>{{/canSignIn}}
        """

    static let message = """
        <p class="{{kind}}">{{text}}</p>
        {{#links}}<p><a href="{{href}}">{{label}}</a></p>{{/links}}
        """

    static let css = """
        :root { --fg: #1d232a; --muted: #5f6b76; --line: #d8dee4; --bg: #f6f8fa; --ok: #1a7f37; --bad: #cf222e; --accent: #0b5cad; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #fff; }
        header { display: flex; gap: 1.5rem; align-items: center; padding: .6rem 1.5rem; background: #16202b; color: #fff; flex-wrap: wrap; }
        header a { color: #fff; text-decoration: none; }
        header nav a { margin-right: 1rem; opacity: .9; }
        header .brand { font-weight: 700; }
        header .who { margin-left: auto; }
        header input { font: inherit; }
        main { padding: 1rem 1.5rem 3rem; max-width: 1200px; }
        h1 { font-size: 1.4rem; margin: .4rem 0 1rem; }
        h2 { font-size: 1.1rem; margin: 1.6rem 0 .5rem; }
        h3 { font-size: 1rem; }
        a { color: var(--accent); }
        table { border-collapse: collapse; width: 100%; margin: .4rem 0; }
        th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { background: var(--bg); font-weight: 600; }
        td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
        .mono, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; }
        .small { font-size: 12px; }
        .muted { color: var(--muted); }
        .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: .8rem; }
        .card { border: 1px solid var(--line); border-radius: 6px; padding: .7rem .9rem; background: var(--bg); }
        .card.alert { border-color: var(--bad); }
        .card .figure { font-size: 1.5rem; font-weight: 650; font-variant-numeric: tabular-nums; }
        .card .label { color: var(--muted); }
        .badge { display: inline-block; padding: 0 .45rem; border-radius: 9px; background: var(--bg); border: 1px solid var(--line); font-size: 12px; }
        .badge.live { color: var(--ok); border-color: var(--ok); }
        .badge.stale, .badge.alert { color: var(--bad); border-color: var(--bad); }
        .alert-text { color: var(--bad); }
        .warning { color: #9a6700; }
        .advice p { margin: .2rem 0; }
        .advice code, td code { background: var(--bg); padding: 0 .2rem; border-radius: 3px; }
        .sentence { max-width: 36rem; }
        form.row, form.stack { display: flex; gap: .6rem; align-items: end; flex-wrap: wrap; margin: .6rem 0; }
        form.stack { flex-direction: column; align-items: start; max-width: 28rem; }
        form.stack label { display: flex; flex-direction: column; width: 100%; }
        form.inline { display: inline; }
        input, button { font: inherit; padding: .25rem .4rem; }
        button, a.button { border: 1px solid var(--line); background: #fff; border-radius: 5px; padding: .3rem .7rem; cursor: pointer; color: var(--fg); text-decoration: none; display: inline-block; }
        button.danger { background: var(--bad); color: #fff; border-color: var(--bad); }
        button.link { background: none; border: 0; color: #fff; text-decoration: underline; padding: 0; }
        form.confirm { margin: 1rem 0; }
        pre { background: var(--bg); border: 1px solid var(--line); padding: .7rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
        dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
        dl.facts dt { color: var(--muted); }
        dl.facts dd { margin: 0; }
        svg.chart { width: 100%; max-width: 900px; height: auto; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
        """

    static let favicon = """
        <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#16202b"/><path d="M4 11V5h4a2 2 0 0 1 0 4H4" stroke="#fff" stroke-width="1.6" fill="none"/></svg>
        """
}
