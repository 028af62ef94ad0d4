//! The web console (`--console-listen`, off unless set): the page built
//! from `console/` (its files are compiled into the binary, so a
//! deployment needs nothing beside it) and, on the same port, the
//! `TaskService` and `AgentAdminService` over gRPC-Web (`tonic-web`), the
//! very services gRPC clients call, with the same tokens and roles. The
//! page is served to anyone who can reach the port; everything it shows
//! comes through those services, so a caller without a token sees nothing
//! and a submitter's token does not open the fleet.
//!
//! Any path that is not a file of the page answers with the page itself
//! (`index.html`), so that a link into a page of the console (`/agents/…`)
//! loads it.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, Uri, header};
use axum::response::IntoResponse;
use rust_embed::RustEmbed;
use switchyard_proto::v1::agent_admin_service_server::AgentAdminServiceServer;
use switchyard_proto::v1::task_service_server::TaskServiceServer;
use tokio::net::TcpListener;
use tower::Layer;
use tracing::{info, warn};

use crate::api::{AdminApi, Api, TaskApi};

/// The console's files, built by `scripts/build-console` into
/// `console/dist` (checked in, like the generated stubs).
#[derive(RustEmbed)]
#[folder = "../console/dist/"]
struct Assets;

/// The console's router: the two services over gRPC-Web, and the page.
pub fn router(api: Api, max_message_bytes: usize) -> Router {
    let services = tonic::service::Routes::new(
        TaskServiceServer::new(TaskApi(api.clone()))
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes),
    )
    .add_service(
        AgentAdminServiceServer::new(AdminApi(api))
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes),
    );
    let grpc_web = tonic_web::GrpcWebLayer::new().layer(services);
    Router::new()
        .route_service("/switchyard.v1.TaskService/{*method}", grpc_web.clone())
        .route_service("/switchyard.v1.AgentAdminService/{*method}", grpc_web)
        .fallback(asset)
}

/// A file of the page, or the page itself for any other path.
async fn asset(uri: Uri) -> Result<Response<Body>, Infallible> {
    let path = uri.path().trim_start_matches('/');
    let (file, path) = match Assets::get(path) {
        Some(file) if !path.is_empty() => (file, path),
        _ => match Assets::get("index.html") {
            Some(file) => (file, "index.html"),
            None => {
                return Ok((StatusCode::NOT_FOUND, "the console was not built").into_response());
            }
        },
    };
    let mime = file.metadata.mimetype();
    // Built files carry their content's hash in their names: they never
    // change. The page itself is looked at again each time.
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut response = Response::new(Body::from(file.data.into_owned()));
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(mime) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    Ok(response)
}

/// Serves the console on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, router: Router) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "console on http://{addr}/");
    }
    if let Err(err) = axum::serve(listener, router).await {
        warn!(cause = %err, "the console listener stopped");
    }
}

/// Binds the console's address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_built_into_the_binary() {
        assert!(Assets::get("index.html").is_some());
    }

    #[tokio::test]
    async fn any_other_path_is_the_page() {
        let uri: Uri = "/agents/0190".parse().unwrap();
        let response = asset(uri).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            HeaderValue::from_static("text/html")
        );
    }
}
