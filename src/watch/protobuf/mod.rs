//! Watches in protobuf. kube's watcher speaks JSON only. For the kinds a big cluster has most of,
//! JSON is the costly part of rekindle's start-up, on both sides: a Secret's bytes are base64-encoded
//! (15,000 Secrets of 8 KiB: 171 MB of JSON, 127 MB of protobuf, streamed in about half the time and
//! apiserver CPU), and 100,000 Deployments are 641 MB of JSON against 205 MB of protobuf, listed in
//! 12.5 s against 3.4 s.
//!
//! This is the watch protocol, in the few lines of protobuf it needs: the first state streamed as
//! events up to the `k8s.io/initial-events-end` bookmark, then a watch resumed from the last
//! resourceVersion seen, a fresh first state on 410 Gone. It yields the events kube's watcher yields,
//! so the driver and the handlers are the ones every watch uses. Each kind decodes only the fields
//! rekindle reads ([`config`], [`workloads`]); protobuf skips the rest. An apiserver that does not
//! serve protobuf (406/415), or an event these messages cannot decode, ends the stream ([`Fallback`]
//! says which), and the caller falls back to kube's watcher.

pub mod config;
pub mod workloads;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::api::WatchParams;
use kube::client::Body;
use kube::runtime::watcher::Event;
use kube::{Client, Resource};
use prost::Message;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::io::StreamReader;

pub(super) const ACCEPT: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// What every protobuf-encoded object starts with, before its `runtime.Unknown` envelope.
const MAGIC: &[u8] = b"k8s\0";
/// A Secret is at most 1 MiB of data; the frame limit leaves room for its metadata.
const MAX_FRAME: usize = 16 << 20;
/// The apiserver ends a watch after this long; it is resumed from the last resourceVersion.
const WATCH_TIMEOUT_S: u32 = 290;

/// A kind's message: the fields rekindle reads, and the object the handler takes.
pub trait Decode: Message + Default + Send + 'static {
    /// The kind, for errors.
    const KIND: &'static str;
    type Object: Resource + Send + 'static;
    /// A bookmark's resourceVersion and annotations (a bookmark is an object with metadata only).
    fn bookmark(&self) -> (&str, &BTreeMap<String, String>);
    /// The object the handler takes (an error names what could not be read).
    fn into_object(self) -> Result<Self::Object, String>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("watch request failed: {0}")]
    Request(#[from] kube::Error),
    #[error("apiserver answered {code}: {message}")]
    Status { code: u16, message: String },
    #[error("watch stream broke: {0}")]
    Io(#[from] std::io::Error),
    #[error("undecodable watch event: {0}")]
    Decode(String),
    #[error("watch stream ended before the first state was complete")]
    Incomplete,
}

impl Error {
    fn gone(&self) -> bool {
        matches!(self, Error::Status { code: 410, .. })
    }

    /// The state after this error: a fresh first state on 410 Gone, the end of the protobuf watch on
    /// an event it cannot read (a retry would read the same event), else `retry`.
    fn next_state(&self, retry: State) -> State {
        match self {
            e if e.gone() => State::Empty,
            Error::Decode(_) => State::Ended(Fallback::Undecodable),
            _ => retry,
        }
    }
}

/// Why a protobuf watch ended: from then on the kind is watched in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The apiserver answered 406 or 415.
    NotServed,
    /// An event these messages could not decode (the error was yielded before the end).
    Undecodable,
}

impl Fallback {
    /// The `reason` label of `rekindle_watch_protobuf_fallbacks_total`.
    pub fn label(self) -> &'static str {
        match self {
            Fallback::NotServed => "not_served",
            Fallback::Undecodable => "undecodable",
        }
    }
}

/// Why the stream of a [`watch`] ended, once it has.
#[derive(Clone, Default)]
pub struct Ending(Arc<OnceLock<Fallback>>);

impl Ending {
    pub fn reason(&self) -> Option<Fallback> {
        self.0.get().copied()
    }
}

/// `metav1.WatchEvent`: the event type and the object, itself a `runtime.Unknown` after [`MAGIC`].
#[derive(Clone, PartialEq, Message)]
struct WatchEventPb {
    #[prost(string, tag = "1")]
    r#type: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtensionPb>,
}

#[derive(Clone, PartialEq, Message)]
struct RawExtensionPb {
    #[prost(bytes = "bytes", tag = "1")]
    raw: Bytes,
}

#[derive(Clone, PartialEq, Message)]
struct UnknownPb {
    #[prost(bytes = "bytes", tag = "2")]
    raw: Bytes,
}

/// `metav1.Time`: seconds since the epoch (Kubernetes' JSON has no fractions either).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TimePb {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
}

/// `metav1.Status`, the object of an ERROR event and the body of a refused request.
#[derive(Clone, PartialEq, Message)]
struct StatusPb {
    #[prost(string, tag = "3")]
    message: String,
    #[prost(string, tag = "4")]
    reason: String,
    #[prost(int32, tag = "6")]
    code: i32,
}

/// One decoded watch event.
#[derive(Debug)]
enum Frame<T> {
    Applied(T),
    Deleted(T),
    Bookmark {
        resource_version: String,
        initial_end: bool,
    },
}

/// The object inside a `runtime.Unknown` envelope, sharing `raw`'s buffer (decoded from `Bytes`,
/// prost slices its bytes fields instead of copying them).
fn unwrap_envelope(raw: Bytes) -> Result<Bytes, Error> {
    if !raw.starts_with(MAGIC) {
        return Err(Error::Decode("object without the protobuf envelope".into()));
    }
    UnknownPb::decode(raw.slice(MAGIC.len()..))
        .map(|u| u.raw)
        .map_err(|e| Error::Decode(format!("envelope: {e}")))
}

fn decode_frame<M: Decode>(frame: Bytes) -> Result<Frame<M::Object>, Error> {
    let event = WatchEventPb::decode(frame).map_err(|e| Error::Decode(format!("event: {e}")))?;
    let raw = unwrap_envelope(event.object.unwrap_or_default().raw)?;
    if event.r#type == "ERROR" {
        let status =
            StatusPb::decode(raw).map_err(|e| Error::Decode(format!("ERROR status: {e}")))?;
        return Err(status_error(status));
    }
    let pb = M::decode(raw).map_err(|e| Error::Decode(format!("{}: {e}", M::KIND)))?;
    match event.r#type.as_str() {
        "ADDED" | "MODIFIED" => Ok(Frame::Applied(object::<M>(pb)?)),
        "DELETED" => Ok(Frame::Deleted(object::<M>(pb)?)),
        "BOOKMARK" => {
            let (resource_version, annotations) = pb.bookmark();
            Ok(Frame::Bookmark {
                initial_end: annotations.contains_key("k8s.io/initial-events-end"),
                resource_version: resource_version.to_string(),
            })
        }
        other => Err(Error::Decode(format!("unknown event type {other:?}"))),
    }
}

fn object<M: Decode>(pb: M) -> Result<M::Object, Error> {
    pb.into_object()
        .map_err(|e| Error::Decode(format!("{}: {e}", M::KIND)))
}

fn status_error(status: StatusPb) -> Error {
    Error::Status {
        code: u16::try_from(status.code).unwrap_or(500),
        message: format!("{} ({})", status.message, status.reason),
    }
}

type Frames = BoxStream<'static, std::io::Result<BytesMut>>;

enum State {
    /// Nothing listed yet, or a fresh first state is needed (410 Gone).
    Empty,
    /// Streaming the first state.
    Initial(Frames),
    /// The first state is complete up to this resourceVersion; a watch is to be (re)opened.
    Listed(String),
    Watching(Frames, String),
    /// The stream ends: JSON from here.
    Ended(Fallback),
}

/// The objects at `path` (a collection: `/api/v1/secrets`, or one namespace's), as kube watcher
/// events, and why the stream ended once it has.
pub fn watch<M: Decode>(
    client: Client,
    path: String,
    labels: Option<String>,
    fields: Option<String>,
) -> (
    impl Stream<Item = Result<Event<M::Object>, Error>> + Send + 'static,
    Ending,
) {
    let watch = Watch::<M> {
        client,
        request: kube::core::Request::new(path),
        labels,
        fields,
        ending: Ending::default(),
        _message: std::marker::PhantomData,
    };
    let ending = watch.ending.clone();
    let events = futures::stream::unfold((watch, State::Empty), |(watch, state)| async move {
        let (item, next) = watch.step(state).await;
        if let State::Ended(reason) = next {
            let _ = watch.ending.0.set(reason);
        }
        item.map(|item| (item, (watch, next)))
    });
    (events, ending)
}

struct Watch<M> {
    client: Client,
    request: kube::core::Request,
    labels: Option<String>,
    fields: Option<String>,
    /// Set once the stream ends.
    ending: Ending,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M: Decode> Watch<M> {
    /// Advances until there is an event or an error to yield (`None`: the stream ends).
    async fn step(&self, mut state: State) -> (Option<Result<Event<M::Object>, Error>>, State) {
        loop {
            state = match state {
                State::Ended(reason) => return (None, State::Ended(reason)),
                State::Empty => match self.open(None).await {
                    Ok(Some(frames)) => return (Some(Ok(Event::Init)), State::Initial(frames)),
                    Ok(None) => return (None, State::Ended(Fallback::NotServed)),
                    Err(e) => return (Some(Err(e)), State::Empty),
                },
                State::Initial(mut frames) => match next_frame::<M>(&mut frames).await {
                    Some(Ok(Frame::Applied(s))) => {
                        return (Some(Ok(Event::InitApply(s))), State::Initial(frames))
                    }
                    Some(Ok(Frame::Deleted(_))) => State::Initial(frames),
                    Some(Ok(Frame::Bookmark {
                        resource_version,
                        initial_end: true,
                    })) => return (Some(Ok(Event::InitDone)), State::Listed(resource_version)),
                    Some(Ok(Frame::Bookmark { .. })) => State::Initial(frames),
                    Some(Err(e)) => {
                        let next = e.next_state(State::Empty);
                        return (Some(Err(e)), next);
                    }
                    None => return (Some(Err(Error::Incomplete)), State::Empty),
                },
                State::Listed(rv) => match self.open(Some(&rv)).await {
                    Ok(Some(frames)) => State::Watching(frames, rv),
                    Ok(None) => return (None, State::Ended(Fallback::NotServed)),
                    Err(e) => {
                        let next = e.next_state(State::Listed(rv));
                        return (Some(Err(e)), next);
                    }
                },
                State::Watching(mut frames, rv) => match next_frame::<M>(&mut frames).await {
                    Some(Ok(Frame::Applied(o))) => {
                        let rv = o.meta().resource_version.clone().unwrap_or(rv);
                        return (Some(Ok(Event::Apply(o))), State::Watching(frames, rv));
                    }
                    Some(Ok(Frame::Deleted(o))) => {
                        let rv = o.meta().resource_version.clone().unwrap_or(rv);
                        return (Some(Ok(Event::Delete(o))), State::Watching(frames, rv));
                    }
                    Some(Ok(Frame::Bookmark {
                        resource_version, ..
                    })) => State::Watching(frames, resource_version),
                    Some(Err(e)) => {
                        let next = e.next_state(State::Listed(rv));
                        return (Some(Err(e)), next);
                    }
                    // The apiserver's timeout: resume where it left off.
                    None => State::Listed(rv),
                },
            }
        }
    }

    /// Opens a watch: the first state streamed (`rv` absent) or changes after `rv`. `Ok(None)`: the
    /// apiserver does not serve protobuf here.
    async fn open(&self, rv: Option<&str>) -> Result<Option<Frames>, Error> {
        let params = WatchParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            timeout: Some(WATCH_TIMEOUT_S),
            bookmarks: true,
            send_initial_events: rv.is_none(),
        };
        let mut request = self
            .request
            .watch(&params, rv.unwrap_or_default())
            .map_err(kube::Error::BuildRequest)?;
        let headers = request.headers_mut();
        headers.insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
        // As kube does for its watches: a compressed watch stream is not decoded past its first member.
        headers.insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        let response = self.client.send(request.map(Body::from)).await?;
        let code = response.status().as_u16();
        if code == 406 || code == 415 {
            return Ok(None);
        }
        if !response.status().is_success() {
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(refused(code, &body));
        }
        let body = response.into_body().into_data_stream().map_err(|e| {
            // A connection the apiserver closed (its restart, or its timeout without a TLS
            // close_notify) ends the watch, to be resumed; it is not a failure.
            if connection_closed(&e) {
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, e)
            } else {
                std::io::Error::other(e)
            }
        });
        let codec = LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME)
            .new_codec();
        Ok(Some(
            FramedRead::new(StreamReader::new(body), codec).boxed(),
        ))
    }
}

fn connection_closed(e: &kube::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let eof = c
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof);
        if eof || c.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The error of a refused request: its `Status` message when the body is one, else the body's text.
fn refused(code: u16, body: &[u8]) -> Error {
    let status = unwrap_envelope(Bytes::copy_from_slice(body))
        .ok()
        .and_then(|raw| StatusPb::decode(raw).ok());
    let message = match status {
        Some(s) => format!("{} ({})", s.message, s.reason),
        None => String::from_utf8_lossy(body).chars().take(200).collect(),
    };
    Error::Status { code, message }
}

/// The next event; `None` when the stream ended (a connection closed mid-frame is an end too, as
/// the apiserver's timeout may close it that way).
async fn next_frame<M: Decode>(frames: &mut Frames) -> Option<Result<Frame<M::Object>, Error>> {
    match frames.next().await? {
        Ok(frame) => Some(decode_frame::<M>(frame.freeze())),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
        // The codec's answer to a frame over the limit: as undecodable as garbage.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Some(Err(Error::Decode(format!("frame: {e}"))))
        }
        Err(e) => Some(Err(Error::Io(e))),
    }
}

/// A captured watch body cut into its frames (each a 4-byte big-endian length, then the event).
#[cfg(test)]
fn frames(mut wire: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    while !wire.is_empty() {
        let len = u32::from_be_bytes(wire[..4].try_into().unwrap()) as usize;
        out.push(Bytes::copy_from_slice(&wire[4..4 + len]));
        wire = &wire[4 + len..];
    }
    out
}

/// A watch body of these events, each framed as the apiserver frames them: [`frames`] reversed.
#[cfg(test)]
pub(crate) fn wire(events: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::new();
    for event in events {
        body.extend((event.len() as u32).to_be_bytes());
        body.extend(*event);
    }
    body
}

/// The objects of a captured first state, in order, checked to end with its closing bookmark.
#[cfg(test)]
fn first_state<M: Decode>(wire: &[u8]) -> Vec<M::Object> {
    let mut objects = Vec::new();
    let mut closed = false;
    for frame in frames(wire) {
        match decode_frame::<M>(frame).expect("a decodable frame") {
            Frame::Applied(o) => objects.push(o),
            Frame::Bookmark { initial_end, .. } => closed |= initial_end,
            Frame::Deleted(_) => panic!("a deletion in a first state"),
        }
    }
    assert!(closed, "the first state ends with its bookmark");
    objects
}

#[cfg(test)]
mod tests {
    use super::config::SecretPb;
    use super::*;
    use crate::core::hash::{secret_hash, secret_hash_typed};
    use hyper::{Request, Response};
    use k8s_openapi::api::core::v1::Secret;

    // Captured from kube-apiserver 1.35: the first state of a namespace with one Secret (`app-secret`,
    // password=s3cr3t, token=abc, annotated `reloader.stakater.com/match: "true"`) and its closing
    // bookmark; then that Secret's `token` changed to xyz and the Secret deleted; and the answer to
    // a watch from a compacted resourceVersion.
    const INITIAL: &[u8] = include_bytes!("testdata/initial.pb");
    const CHANGES: &[u8] = include_bytes!("testdata/changes.pb");
    const GONE: &[u8] = include_bytes!("testdata/gone.pb");

    fn applied(frame: Result<Frame<Secret>, Error>) -> Secret {
        match frame {
            Ok(Frame::Applied(s)) => s,
            other => panic!("expected an applied Secret, got {other:?}"),
        }
    }

    /// The resourceVersion of the bookmark that closes [`INITIAL`]'s first state.
    fn closing_bookmark() -> String {
        match decode_frame::<SecretPb>(frames(INITIAL)[1].clone()) {
            Ok(Frame::Bookmark {
                resource_version,
                initial_end: true,
            }) => resource_version,
            other => panic!("expected the closing bookmark, got {other:?}"),
        }
    }

    #[test]
    fn decodes_the_first_state_and_its_closing_bookmark() {
        let f = frames(INITIAL);
        assert_eq!(f.len(), 2);
        let s = applied(decode_frame::<SecretPb>(f[0].clone()));
        assert_eq!(s.metadata.name.as_deref(), Some("app-secret"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("pbfix"));
        assert!(s.metadata.resource_version.is_some());
        assert_eq!(
            s.metadata.annotations.as_ref().unwrap()["reloader.stakater.com/match"],
            "true"
        );
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        let times: Vec<_> = s.metadata.managed_fields.iter().flatten().collect();
        assert!(!times.is_empty() && times.iter().all(|f| f.time.is_some()));
        // The hash is Reloader's, from the decoded bytes: what the JSON watch gave.
        assert_eq!(
            secret_hash_typed(&s),
            secret_hash([("password", &b"s3cr3t"[..]), ("token", &b"abc"[..])])
        );
        assert!(!closing_bookmark().is_empty());
    }

    #[test]
    fn decodes_changes_and_deletions() {
        let f = frames(CHANGES);
        assert_eq!(f.len(), 2);
        let changed = applied(decode_frame::<SecretPb>(f[0].clone()));
        assert_eq!(
            secret_hash_typed(&changed),
            secret_hash([("password", &b"s3cr3t"[..]), ("token", &b"xyz"[..])])
        );
        match decode_frame::<SecretPb>(f[1].clone()) {
            Ok(Frame::Deleted(s)) => assert_eq!(s.metadata.name.as_deref(), Some("app-secret")),
            other => panic!("expected a deletion, got {other:?}"),
        }
    }

    #[test]
    fn an_error_event_is_its_status() {
        let f = frames(GONE);
        let e = decode_frame::<SecretPb>(f[0].clone()).unwrap_err();
        assert!(e.gone(), "{e}");
        assert!(e.to_string().contains("too old resource version"), "{e}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for wire in [
            &b""[..],
            b"\x0a\x05ADDED\x12\x03\x0a\x01x",
            b"\xff\xff\xff",
            b"\x0a\x02ZZ",
        ] {
            assert!(decode_frame::<SecretPb>(Bytes::copy_from_slice(wire)).is_err());
        }
        // A Secret whose envelope is intact but whose body is cut short.
        let mut cut = frames(INITIAL)[0].to_vec();
        cut.truncate(cut.len() / 2);
        assert!(decode_frame::<SecretPb>(Bytes::from(cut)).is_err());
    }

    /// The watch against a scripted apiserver: first state, resume, 410 and a fresh first state,
    /// changes, then an apiserver that stops serving protobuf.
    #[tokio::test]
    async fn follows_the_watch_protocol() {
        let (client, mut handle) = crate::mock_api::client();
        let server = tokio::spawn(async move {
            let mut queries = Vec::new();
            let answers: [(u16, &[u8]); 5] = [
                (200, INITIAL),
                (200, GONE),
                (200, INITIAL),
                (200, CHANGES),
                (406, b"not acceptable"),
            ];
            for (status, body) in answers {
                let (request, send) = handle.next_request().await.expect("a request");
                let request: Request<Body> = request;
                assert_eq!(request.headers()["accept"], ACCEPT);
                queries.push(request.uri().query().unwrap_or_default().to_string());
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.to_vec()))
                        .unwrap(),
                );
            }
            queries
        });
        let (events, ending) = watch::<SecretPb>(
            client,
            "/api/v1/namespaces/pbfix/secrets".into(),
            None,
            Some("type!=helm.sh/release.v1".into()),
        );
        assert_eq!(ending.reason(), None);
        let events: Vec<String> = events
            .map(|e| match e {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(s)) => format!("init-apply {}", secret_hash_typed(&s)),
                Ok(Event::InitDone) => "init-done".to_string(),
                Ok(Event::Apply(s)) => format!("apply {}", secret_hash_typed(&s)),
                Ok(Event::Delete(s)) => format!("delete {}", s.metadata.name.unwrap_or_default()),
                Err(e) => format!("error {}", e.gone()),
            })
            .collect()
            .await;
        let first = secret_hash([("password", &b"s3cr3t"[..]), ("token", &b"abc"[..])]);
        let changed = secret_hash([("password", &b"s3cr3t"[..]), ("token", &b"xyz"[..])]);
        let init = [
            "init".to_string(),
            format!("init-apply {first}"),
            "init-done".into(),
        ];
        let mut want = init.to_vec();
        want.push("error true".into());
        want.extend(init);
        want.extend([format!("apply {changed}"), "delete app-secret".into()]);
        assert_eq!(events, want);
        assert_eq!(ending.reason(), Some(Fallback::NotServed));

        let queries = server.await.unwrap();
        let bookmark_rv = closing_bookmark();
        for (i, q) in queries.iter().enumerate() {
            assert!(
                q.contains("fieldSelector=type%21%3Dhelm.sh%2Frelease.v1"),
                "{q}"
            );
            let initial = i == 0 || i == 2;
            assert_eq!(
                q.contains("sendInitialEvents=true"),
                initial,
                "request {i}: {q}"
            );
            if !initial {
                // Resumed after the first state's bookmark; the last, after the deletion's version.
                assert!(!q.contains(&"resourceVersion=&".to_string()), "{q}");
            }
        }
        assert!(queries[1].contains(&format!("resourceVersion={bookmark_rv}")));
        assert!(queries[3].contains(&format!("resourceVersion={bookmark_rv}")));
        assert!(!queries[4].contains(&format!("resourceVersion={bookmark_rv}")));
    }

    /// An event that cannot be decoded, or a frame over the limit, is yielded as an error, then the
    /// stream ends for JSON to take over: retrying would read the same event again, forever.
    #[tokio::test]
    async fn an_undecodable_event_ends_the_watch() {
        let changed = frames(CHANGES)[0].clone();
        let garbage = wire(&[&changed, b"\x0a\x08MODIFIED\x12\x03\x0a\x01x"]);
        let mut oversized = wire(&[&changed]);
        oversized.extend((MAX_FRAME as u32 + 1).to_be_bytes());
        oversized.extend(b"more to come");
        for body in [garbage, oversized] {
            ends_after_a_change(body).await;
        }
    }

    /// A watch whose first state is [`INITIAL`] and whose resumed watch answers `body`.
    async fn ends_after_a_change(body: Vec<u8>) {
        let (client, mut handle) = crate::mock_api::client();
        let server = tokio::spawn(async move {
            let mut requests = 0;
            for answer in [INITIAL.to_vec(), body] {
                let (_, send) = handle.next_request().await.expect("a request");
                requests += 1;
                send.send_response(Response::builder().body(Body::from(answer)).unwrap());
            }
            // Nothing more is asked once the stream has ended and the client is dropped.
            while handle.next_request().await.is_some() {
                requests += 1;
            }
            requests
        });
        let (events, ending) = watch::<SecretPb>(client, "/api/v1/secrets".into(), None, None);
        let events: Vec<_> = events.collect().await;
        assert_eq!(ending.reason(), Some(Fallback::Undecodable));
        assert!(
            matches!(
                events[..],
                [
                    Ok(Event::Init),
                    Ok(Event::InitApply(_)),
                    Ok(Event::InitDone),
                    Ok(Event::Apply(_)),
                    Err(Error::Decode(_))
                ]
            ),
            "{events:?}"
        );
        assert_eq!(server.await.unwrap(), 2);
    }
}
