//! The few functions of librados and librbd the backend calls, declared
//! from `rados/librados.h` and `rbd/librbd.h` (Ceph 16). Every one returns
//! a negative errno on failure.

use libc::{c_char, c_int, c_void, size_t, ssize_t};

pub type RadosT = *mut c_void;
pub type IoctxT = *mut c_void;
pub type ImageT = *mut c_void;
pub type CompletionT = *mut c_void;
pub type Callback = Option<unsafe extern "C" fn(CompletionT, *mut c_void)>;

/// `rbd_lock_mode_t`.
pub const LOCK_MODE_EXCLUSIVE: c_int = 0;
/// `RBD_FEATURE_EXCLUSIVE_LOCK`.
pub const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

extern "C" {
    pub fn rados_create(cluster: *mut RadosT, id: *const c_char) -> c_int;
    pub fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_connect(cluster: RadosT) -> c_int;
    pub fn rados_shutdown(cluster: RadosT);
    pub fn rados_ioctx_create(cluster: RadosT, pool: *const c_char, io: *mut IoctxT) -> c_int;
    pub fn rados_ioctx_destroy(io: IoctxT);
    pub fn rados_getaddrs(cluster: RadosT, addrs: *mut *mut c_char) -> c_int;
    pub fn rados_mon_command(
        cluster: RadosT,
        cmd: *mut *const c_char,
        cmdlen: size_t,
        inbuf: *const c_char,
        inbuflen: size_t,
        outbuf: *mut *mut c_char,
        outbuflen: *mut size_t,
        outs: *mut *mut c_char,
        outslen: *mut size_t,
    ) -> c_int;
    pub fn rados_buffer_free(buf: *mut c_char);

    pub fn rbd_create(io: IoctxT, name: *const c_char, size: u64, order: *mut c_int) -> c_int;
    pub fn rbd_remove(io: IoctxT, name: *const c_char) -> c_int;
    pub fn rbd_open(
        io: IoctxT,
        name: *const c_char,
        image: *mut ImageT,
        snap: *const c_char,
    ) -> c_int;
    pub fn rbd_open_read_only(
        io: IoctxT,
        name: *const c_char,
        image: *mut ImageT,
        snap: *const c_char,
    ) -> c_int;
    pub fn rbd_close(image: ImageT) -> c_int;
    pub fn rbd_get_size(image: ImageT, size: *mut u64) -> c_int;
    pub fn rbd_get_features(image: ImageT, features: *mut u64) -> c_int;
    pub fn rbd_get_stripe_unit(image: ImageT, stripe_unit: *mut u64) -> c_int;
    pub fn rbd_get_stripe_count(image: ImageT, stripe_count: *mut u64) -> c_int;
    pub fn rbd_read(image: ImageT, ofs: u64, len: size_t, buf: *mut c_char) -> ssize_t;

    pub fn rbd_aio_create_completion(arg: *mut c_void, cb: Callback, c: *mut CompletionT) -> c_int;
    pub fn rbd_aio_write(
        image: ImageT,
        off: u64,
        len: size_t,
        buf: *const c_char,
        c: CompletionT,
    ) -> c_int;
    pub fn rbd_aio_read(
        image: ImageT,
        off: u64,
        len: size_t,
        buf: *mut c_char,
        c: CompletionT,
    ) -> c_int;
    pub fn rbd_aio_discard(image: ImageT, off: u64, len: u64, c: CompletionT) -> c_int;
    pub fn rbd_aio_flush(image: ImageT, c: CompletionT) -> c_int;
    pub fn rbd_aio_is_complete(c: CompletionT) -> c_int;
    pub fn rbd_aio_wait_for_complete(c: CompletionT) -> c_int;
    pub fn rbd_aio_get_return_value(c: CompletionT) -> ssize_t;
    pub fn rbd_aio_release(c: CompletionT);

    pub fn rbd_is_exclusive_lock_owner(image: ImageT, is_owner: *mut c_int) -> c_int;
    pub fn rbd_lock_acquire(image: ImageT, mode: c_int) -> c_int;
    pub fn rbd_lock_get_owners(
        image: ImageT,
        mode: *mut c_int,
        owners: *mut *mut c_char,
        max_owners: *mut size_t,
    ) -> c_int;
    pub fn rbd_lock_get_owners_cleanup(owners: *mut *mut c_char, count: size_t);
    pub fn rbd_lock_break(image: ImageT, mode: c_int, owner: *const c_char) -> c_int;
}
