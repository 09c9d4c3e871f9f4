// Small helpers shared by the run file writer and reader (HDF5 C API): RAII handles, checked calls
// that turn a failure into strata::Error with HDF5's own reason, and string datatypes.
// Not thread-safe (neither is the serial HDF5 library): only rank 0 reads or writes run files.
#pragma once
#include <hdf5.h>

#include <string>
#include <string_view>
#include <utility>

#include "strata/types.hpp"

namespace strata::h5 {

// Owns one HDF5 identifier; `Close` is the matching H5?close function.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: pass straight to the C API
  // Closes now and returns the status (a file close flushes, so it can fail); the destructor,
  // used on error paths, ignores it.
  herr_t close() { return id_ < 0 ? 0 : Close(std::exchange(id_, H5I_INVALID_HID)); }
  void reset() { (void)close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Attribute = Handle<H5Aclose>;
using Space = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;
using PropList = Handle<H5Pclose>;

// Turns off HDF5's printing of its error stack for the lifetime of the object (restores it after),
// so that a user sees one strata::Error line instead of an HDF5 trace.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5's reason for the last failure on this thread: the outermost and the innermost message of
// its error stack, e.g. "unable to open file (file signature not found)".
inline std::string last_error() {
  struct Walk {
    std::string outer, inner;
  } walk;
  auto cb = [](unsigned n, const H5E_error2_t* e, void* p) -> herr_t {
    auto* w = static_cast<Walk*>(p);
    if (e->desc == nullptr) return 0;
    if (n == 0) w->outer = e->desc;
    w->inner = e->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, cb, &walk);
  if (walk.outer.empty()) return "no HDF5 error detail";
  if (walk.inner == walk.outer) return walk.outer;
  return walk.outer + " (" + walk.inner + ")";
}

// Throws strata::Error "<what>: <HDF5 reason> [source:line]" when an HDF5 call failed (< 0).
// `what` names the operation and the HDF5 object, e.g. "create dataset '/steps/loss'"; the caller
// adds the file path. The caller's file and line come from __builtin_FILE/__builtin_LINE rather
// than std::source_location, which clang 14 (the fuzz build) cannot compile with libstdc++ 12.
template <typename T>
T check(T status, std::string_view what, std::string_view hint = {},
        std::string_view source = __builtin_FILE(), int line = __builtin_LINE()) {
  if (status < 0) {
    const std::string file(source.substr(source.find_last_of('/') + 1));
    throw Error(
        std::string(what) + ": " + last_error() + " [" + file + ":" + std::to_string(line) + "]",
        std::string(hint));
  }
  return status;
}

// Variable-length UTF-8 string type: what the writer stores and the reader asks for.
inline Type vlen_string_type() {
  Type t(check(H5Tcopy(H5T_C_S1), "copy string type"));
  check(H5Tset_size(t, H5T_VARIABLE), "set string type size");
  check(H5Tset_cset(t, H5T_CSET_UTF8), "set string type charset");
  return t;
}

// A boolean as h5py stores numpy.bool_ (and reads it back as one): an enum of int8 with the members
// FALSE = 0 and TRUE = 1.
inline Type bool_type() {
  Type t(check(H5Tenum_create(H5T_NATIVE_INT8), "create boolean type"));
  const signed char no = 0, yes = 1;
  check(H5Tenum_insert(t, "FALSE", &no), "create boolean type");
  check(H5Tenum_insert(t, "TRUE", &yes), "create boolean type");
  return t;
}

}  // namespace strata::h5
