//! `switchyard`, the operator and submitter CLI: submit, get, list, cancel,
//! watch and explain tasks; list, show, drain and undrain agents; simulate a
//! placement. It talks to any replica over the same gRPC contract as
//! grpcurl, prints text for people or JSON (`--output json`) for scripts,
//! and exits with a code a script can branch on (see [`ExitCode`]). A
//! server that does not answer within `--timeout-secs` is unavailable.
//! `args` holds the commands and flags, `json` the replies as proto3 JSON,
//! `render` the text for people; this module runs the commands.

mod args;
mod json;
mod render;

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::Value;
use switchyard_proto::v1::{
    self as pb, agent_admin_service_client::AgentAdminServiceClient,
    task_service_client::TaskServiceClient,
};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

pub use args::Cli;
use args::{AgentsCommand, Command, Global, Output, SubmitArgs};

use switchyard_proto::convert;

/// What the process exits with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Done (with `--wait`: the task succeeded).
    Ok = 0,
    /// With `--wait` or `watch`: the task failed or was canceled.
    TaskUnsuccessful = 1,
    /// Bad arguments or input (clap's usage errors also exit 2).
    Usage = 2,
    /// The task or agent does not exist.
    NotFound = 3,
    /// Not allowed (token missing, wrong role or namespace).
    Denied = 4,
    /// The server refused the request (invalid, precondition, limits).
    Refused = 5,
    /// The server could not be reached or failed.
    Unavailable = 6,
}

/// Runs the CLI with the given arguments and returns the exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Completion { shell } => return completion(shell),
        Command::Man => return man(),
        _ => {}
    }
    let output = cli.global.output;
    match execute(cli).await {
        Ok(code) => code,
        Err(failure) => {
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({"error": failure.message, "code": failure.code_name})
                ),
                Output::Text => eprintln!("switchyard: {}", failure.message),
            }
            failure.exit
        }
    }
}

/// `switchyard completion SHELL`: clap's completion script for the CLI.
fn completion(shell: clap_complete::Shell) -> ExitCode {
    let mut command = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut command, "switchyard", &mut std::io::stdout());
    ExitCode::Ok
}

/// `switchyard man`: the manual page, from the same definitions as `--help`.
fn man() -> ExitCode {
    let command = <Cli as clap::CommandFactory>::command();
    match clap_mangen::Man::new(command).render(&mut std::io::stdout()) {
        Ok(()) => ExitCode::Ok,
        Err(err) => {
            eprintln!("switchyard: writing the manual page: {err}");
            ExitCode::Unavailable
        }
    }
}

/// A failed command: what to print and what to exit with.
#[derive(Debug)]
struct Failure {
    message: String,
    code_name: &'static str,
    exit: ExitCode,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code_name: "usage",
            exit: ExitCode::Usage,
        }
    }
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        let exit = match status.code() {
            Code::NotFound => ExitCode::NotFound,
            Code::Unauthenticated | Code::PermissionDenied => ExitCode::Denied,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::AlreadyExists
            | Code::OutOfRange => ExitCode::Refused,
            _ => ExitCode::Unavailable,
        };
        Self {
            message: status.message().to_owned(),
            code_name: code_name(status.code()),
            exit,
        }
    }
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::NotFound => "not_found",
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "permission_denied",
        Code::InvalidArgument => "invalid_argument",
        Code::FailedPrecondition => "failed_precondition",
        Code::ResourceExhausted => "resource_exhausted",
        Code::Unavailable => "unavailable",
        Code::Unimplemented => "unimplemented",
        _ => "error",
    }
}

/// Attaches the bearer token, if any, to every request.
#[derive(Clone)]
struct Auth(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type Intercepted = tonic::service::interceptor::InterceptedService<Channel, Auth>;

struct Clients {
    tasks: TaskServiceClient<Intercepted>,
    agents: AgentAdminServiceClient<Intercepted>,
}

async fn connect(global: &Global) -> Result<Clients, Failure> {
    let tls = switchyard_proto::client::ClientTls {
        ca_file: global.ca_file.clone(),
        cert_file: global.tls_cert.clone(),
        key_file: global.tls_key.clone(),
    };
    let endpoint =
        switchyard_proto::client::endpoint(&global.server, &tls).map_err(Failure::usage)?;
    // An address that never answers fails in seconds, not never; so does a
    // server that accepts and then says nothing (the deadline covers the
    // wait for an answer's headers, not a stream that follows them).
    let deadline = std::time::Duration::from_secs(global.timeout_secs);
    let endpoint = endpoint.connect_timeout(deadline).timeout(deadline);
    let channel = endpoint.connect().await.map_err(|err| Failure {
        message: format!("cannot reach {}: {err}", global.server),
        code_name: "unavailable",
        exit: ExitCode::Unavailable,
    })?;
    let auth = match &global.token {
        Some(token) => Some(
            format!("Bearer {token}")
                .parse()
                .map_err(|_| Failure::usage("--token has characters a header cannot carry"))?,
        ),
        None => None,
    };
    Ok(Clients {
        tasks: TaskServiceClient::with_interceptor(channel.clone(), Auth(auth.clone())),
        agents: AgentAdminServiceClient::with_interceptor(channel, Auth(auth)),
    })
}

fn placement(selector: &str, policy: Option<pb::PlacementPolicy>) -> Option<pb::Placement> {
    (!selector.trim().is_empty() || policy.is_some()).then(|| pb::Placement {
        selector: selector.to_owned(),
        policy: policy.unwrap_or_default() as i32,
        ..Default::default()
    })
}

fn read_payload(source: Option<&str>) -> Result<prost_types::Struct, Failure> {
    let Some(source) = source else {
        return Ok(prost_types::Struct::default());
    };
    let mut text = String::new();
    if source == "-" {
        std::io::stdin().read_to_string(&mut text).map_err(|err| {
            Failure::usage(format!("reading the payload from standard input: {err}"))
        })?;
    } else {
        text = std::fs::read_to_string(source)
            .map_err(|err| Failure::usage(format!("reading the payload from {source}: {err}")))?;
    }
    let value: Value = serde_json::from_str(&text)
        .map_err(|err| Failure::usage(format!("the payload is not JSON: {err}")))?;
    if !value.is_object() {
        return Err(Failure::usage("the payload must be a JSON object"));
    }
    convert::check_carried(&value, "payload").map_err(|err| Failure::usage(err.to_string()))?;
    Ok(convert::json_to_struct(&value))
}

fn parse_state(text: &str) -> Result<i32, Failure> {
    let name = format!("TASK_STATE_{}", text.to_ascii_uppercase());
    pb::TaskState::from_str_name(&name)
        .map(|s| s as i32)
        .ok_or_else(|| Failure::usage(format!("unknown state {text:?}")))
}

async fn execute(cli: Cli) -> Result<ExitCode, Failure> {
    let global = cli.global;
    let mut clients = connect(&global).await?;
    let out = Printer(global.output);
    match cli.command {
        Command::Submit(args) => submit(&mut clients, &out, &global, args).await,
        Command::SubmitMany { file, batch } => {
            submit_many(&mut clients, &out, &global, &file, usize::from(batch)).await
        }
        Command::Get { task_id } => {
            let reply = clients
                .tasks
                .get_task(pb::GetTaskRequest { task_id })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::task(&reply.task.clone().unwrap_or_default(), "")
            })?;
            Ok(ExitCode::Ok)
        }
        Command::List {
            states,
            kind,
            limit,
        } => {
            let states = states
                .iter()
                .map(|s| parse_state(s))
                .collect::<Result<Vec<_>, _>>()?;
            let reply = clients
                .tasks
                .list_tasks(pb::ListTasksRequest {
                    namespace: global.namespace.clone(),
                    states,
                    kind: kind.unwrap_or_default(),
                    page_size: limit,
                    page_token: String::new(),
                })
                .await?
                .into_inner();
            out.reply(&reply, || render::task_list(&reply.tasks))?;
            Ok(ExitCode::Ok)
        }
        Command::Cancel {
            task_id,
            reason,
            grace_secs,
        } => {
            let grace = grace_secs.map(secs);
            let reply = clients
                .tasks
                .cancel_task(pb::CancelTaskRequest {
                    task_id,
                    reason,
                    grace,
                })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::task(&reply.task.clone().unwrap_or_default(), "cancel requested");
            })?;
            Ok(ExitCode::Ok)
        }
        Command::Watch { task_id } => follow(&mut clients, &out, &task_id, Follow::Changes).await,
        Command::Logs {
            task_id,
            follow: true,
            ..
        } => follow(&mut clients, &out, &task_id, Follow::Output).await,
        Command::Logs { task_id, lease, .. } => logs(&mut clients, &out, task_id, lease).await,
        Command::Explain { task_id } => {
            let reply = clients
                .tasks
                .explain_task(pb::ExplainTaskRequest { task_id })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::explanation(reply.task.as_ref(), &reply.summary, &reply.verdicts, "");
            })?;
            Ok(ExitCode::Ok)
        }
        Command::Simulate {
            selector,
            kind,
            policy,
        } => {
            let reply = clients
                .agents
                .simulate_placement(pb::SimulatePlacementRequest {
                    namespace: global.namespace.clone(),
                    placement: Some(placement(&selector, policy).unwrap_or_default()),
                    hypothetical_capabilities: None,
                    kind,
                    hypothetical_kinds: Vec::new(),
                })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::explanation(None, &reply.summary, &reply.verdicts, &reply.ranking);
            })?;
            Ok(ExitCode::Ok)
        }
        Command::Agents(command) => agents(&mut clients, &out, &global, command).await,
        // Answered before connecting (see `run`).
        Command::Completion { .. } | Command::Man => Ok(ExitCode::Ok),
    }
}

/// A number of seconds from the command line, as a duration.
fn secs(secs: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// `switchyard submit`: the task, and with `--wait` its watch.
async fn submit(
    clients: &mut Clients,
    out: &Printer,
    global: &Global,
    args: SubmitArgs,
) -> Result<ExitCode, Failure> {
    let ms = |ms: u64| convert::duration(i64::try_from(ms).unwrap_or(i64::MAX));
    let retry = (args.retry_initial_backoff_ms.is_some()
        || args.retry_max_backoff_ms.is_some()
        || args.retry_multiplier.is_some()
        || args.retry_jitter.is_some())
    .then(|| pb::RetryPolicy {
        initial_backoff: args.retry_initial_backoff_ms.map(ms),
        max_backoff: args.retry_max_backoff_ms.map(ms),
        multiplier: args.retry_multiplier.unwrap_or_default(),
        jitter: args.retry_jitter,
    });
    let request = pb::SubmitTaskRequest {
        namespace: global.namespace.clone(),
        kind: args.kind,
        payload: Some(read_payload(args.payload.as_deref())?),
        placement: placement(&args.selector, args.policy),
        priority: args.priority,
        max_attempts: args.max_attempts,
        lease_ttl: (args.lease_ttl_secs > 0).then(|| secs(args.lease_ttl_secs)),
        idempotency_key: args.idempotency_key.unwrap_or_default(),
        not_before: None,
        labels: args
            .labels
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        retry,
        start_timeout: args.start_timeout_secs.map(secs),
        execution_timeout: args.execution_timeout_secs.map(secs),
        cancel_grace: args.cancel_grace_secs.map(secs),
        fairness_key: args.fairness_key.unwrap_or_default(),
        fairness_weight: args.fairness_weight.unwrap_or_default(),
        concurrency_key: args.concurrency_key.unwrap_or_default(),
        concurrency_limit: args.concurrency_limit.unwrap_or_default(),
    };
    let reply = clients.tasks.submit_task(request).await?.into_inner();
    let task = reply.task.clone().unwrap_or_default();
    let how = if reply.created {
        "submitted"
    } else {
        "existing (idempotency key)"
    };
    out.reply(&reply, || render::task(&task, how))?;
    if args.wait {
        return follow(clients, out, &task.task_id, Follow::ChangesAndOutput).await;
    }
    Ok(ExitCode::Ok)
}

/// `switchyard submit-many`: the tasks of `file` (JSON lines), `batch` a
/// call; each task's id, or each call's reply as JSON, in order. A refused
/// call's message names the line of the task it names (`tasks[i]`).
async fn submit_many(
    clients: &mut Clients,
    out: &Printer,
    global: &Global,
    file: &str,
    batch: usize,
) -> Result<ExitCode, Failure> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|err| Failure::usage(format!("reading tasks from standard input: {err}")))?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|err| Failure::usage(format!("reading tasks from {file}: {err}")))?;
    }
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut task: pb::SubmitTaskRequest = json::from_json(line)
            .map_err(|err| Failure::usage(format!("line {}: {err}", i + 1)))?;
        if task.namespace.is_empty() {
            task.namespace.clone_from(&global.namespace);
        }
        tasks.push((i + 1, task));
    }
    if tasks.is_empty() {
        return Err(Failure::usage(format!("{file} holds no tasks")));
    }
    for call in tasks.chunks(batch) {
        let request = pb::SubmitTasksRequest {
            tasks: call.iter().map(|(_, task)| task.clone()).collect(),
        };
        let reply = match clients.tasks.submit_tasks(request).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                let mut failure = Failure::from(status);
                failure.message = name_lines(&failure.message, call);
                return Err(failure);
            }
        };
        out.reply(&reply, || {
            for result in &reply.results {
                println!(
                    "{}",
                    result.task.as_ref().map_or("", |t| t.task_id.as_str())
                );
            }
        })?;
    }
    Ok(ExitCode::Ok)
}

/// `message` with each `tasks[i]` it names followed by the task's line in
/// the file (`tasks[3] (line 7).kind`).
fn name_lines(message: &str, call: &[(usize, pb::SubmitTaskRequest)]) -> String {
    let mut named = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("tasks[") {
        let (before, from) = rest.split_at(at);
        named.push_str(before);
        let index = from["tasks[".len()..].split(']').next().unwrap_or("");
        let end = "tasks[".len() + index.len() + 1;
        match index.parse::<usize>().ok().and_then(|i| call.get(i)) {
            Some((line, _)) if from.len() >= end => {
                named.push_str(&from[..end]);
                named.push_str(&format!(" (line {line})"));
                rest = &from[end..];
            }
            _ => {
                named.push_str("tasks[");
                rest = &from["tasks[".len()..];
            }
        }
    }
    named.push_str(rest);
    named
}

async fn agents(
    clients: &mut Clients,
    out: &Printer,
    global: &Global,
    command: AgentsCommand,
) -> Result<ExitCode, Failure> {
    match command {
        AgentsCommand::List => {
            let reply = clients
                .agents
                .list_agents(pb::ListAgentsRequest {
                    namespace: global.namespace.clone(),
                    statuses: Vec::new(),
                    page_size: 1000,
                    page_token: String::new(),
                })
                .await?
                .into_inner();
            out.reply(&reply, || render::agent_list(&reply.agents))?;
        }
        AgentsCommand::Show { agent_id } => {
            let reply = clients
                .agents
                .get_agent(pb::GetAgentRequest { agent_id })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::agent(&reply.agent.clone().unwrap_or_default(), &reply.leases);
            })?;
        }
        AgentsCommand::Drain {
            agent_id,
            reason,
            deadline_secs,
        } => {
            let reply = clients
                .agents
                .drain_agent(pb::DrainAgentRequest {
                    agent_id,
                    reason,
                    deadline: deadline_secs.map(secs),
                })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::agent(&reply.agent.clone().unwrap_or_default(), &[]);
            })?;
        }
        AgentsCommand::Undrain { agent_id } => {
            let reply = clients
                .agents
                .undrain_agent(pb::UndrainAgentRequest { agent_id })
                .await?
                .into_inner();
            out.reply(&reply, || {
                render::agent(&reply.agent.clone().unwrap_or_default(), &[]);
            })?;
        }
    }
    Ok(ExitCode::Ok)
}

/// What following a task shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Its state changes (`watch`).
    Changes,
    /// Its state changes and its output (`submit --wait`).
    ChangesAndOutput,
    /// Its output (`logs -f`).
    Output,
}

/// Streams a task's changes (and its output) until it is terminal, then
/// (for people) its result or error; the exit code says how it ended.
async fn follow(
    clients: &mut Clients,
    out: &Printer,
    task_id: &str,
    what: Follow,
) -> Result<ExitCode, Failure> {
    let mut stream = clients
        .tasks
        .watch_task(pb::WatchTaskRequest {
            task_id: task_id.to_owned(),
            output: what != Follow::Changes,
            output_offset: 0,
        })
        .await?
        .into_inner();
    let mut last = pb::Task::default();
    let mut shown = render::OutputShown::default();
    while let Some(item) = stream.next().await {
        let item = item?;
        out.reply(&item, || {
            shown.chunks(&item.output);
            if what != Follow::Output && (item.event.is_some() || item.task.is_some()) {
                render::watch_line(item.event.as_ref(), item.task.as_ref().unwrap_or(&last));
            }
        })?;
        if let Some(task) = item.task {
            last = task;
        }
    }
    if out.0 == Output::Text {
        if what == Follow::Output {
            render::ending(&last);
        } else {
            render::outcome(&last);
        }
    }
    Ok(match last.state() {
        pb::TaskState::Succeeded => ExitCode::Ok,
        pb::TaskState::Failed | pb::TaskState::Canceled => ExitCode::TaskUnsuccessful,
        _ => ExitCode::Unavailable,
    })
}

/// `switchyard logs ID`: the task's output as stored, page after page.
async fn logs(
    clients: &mut Clients,
    out: &Printer,
    task_id: String,
    lease: Option<u64>,
) -> Result<ExitCode, Failure> {
    let mut shown = render::OutputShown::default();
    let mut page_token = String::new();
    loop {
        let reply = clients
            .tasks
            .list_task_output(pb::ListTaskOutputRequest {
                task_id: task_id.clone(),
                page_size: 1000,
                page_token,
                fencing_token: lease.unwrap_or(0),
            })
            .await?
            .into_inner();
        out.reply(&reply, || shown.chunks(&reply.chunks))?;
        if reply.next_page_token.is_empty() {
            return Ok(ExitCode::Ok);
        }
        page_token = reply.next_page_token;
    }
}

/// Prints replies: for scripts the reply itself as proto3 JSON, one
/// document per line (what grpcurl prints for the same call); for people
/// what `render` makes of it.
struct Printer(Output);

impl Printer {
    fn reply<M: prost::Name>(&self, reply: &M, text: impl FnOnce()) -> Result<(), Failure> {
        match self.0 {
            Output::Text => text(),
            Output::Json => {
                let value = json::to_json(reply).map_err(|message| Failure {
                    message,
                    code_name: "internal",
                    exit: ExitCode::Unavailable,
                })?;
                println!("{value}");
            }
        }
        Ok(())
    }
}
