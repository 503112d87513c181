// launch/tensorboard.h: TensorBoard event files for a run directory, written
// without TensorFlow.
//
// File: DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>, the name
// TensorFlow's EventsWriter uses; n is 0 unless a file of that name exists
// (never overwritten: the writer takes the next n).
//
// Contents: TFRecords, each
//   uint64 length (little-endian)
//   uint32 masked_crc32c(the 8 length bytes)
//   length bytes of data: one serialized Event (proto/tensorboard.proto)
//   uint32 masked_crc32c(data)
// The first record is Event{file_version: "brain.Event:2"}; then one Event
// per add_scalar / add_text. TensorBoard reads a file while it grows, so
// flush() makes everything added so far visible.
//
// Errors: a file that cannot be created or written gives IoError naming it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/crc32c.h"

namespace mp {

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so a CRC
// stored inside checksummed data does not checksum to a fixed value.
uint32_t masked_crc32c(std::string_view bytes);

inline constexpr char kTensorBoardFileVersion[] = "brain.Event:2";

class TensorBoardWriter {
 public:
  // Creates the event file in `dir`, which must exist (make_run_dir in
  // launch/metrics.h creates it), and writes the file_version record.
  explicit TensorBoardWriter(const std::string& dir);
  // Flushes and closes; errors at this point are not reported (call close()
  // to see them).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }

  // One point of the scalar series `tag` (Scalars tab). Stored as float32,
  // as TensorBoard's simple_value is; NaN and Inf are stored as they are.
  void add_scalar(const std::string& tag, int64_t step, double value);
  // One string of the text series `tag` (Text tab; rendered as Markdown).
  void add_text(const std::string& tag, int64_t step, const std::string& text);

  // Writes buffered records to the file (not fsync).
  void flush();
  // Flushes and closes; later calls to add_* or flush() are bugs. Idempotent.
  void close();

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mp
